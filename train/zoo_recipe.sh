# The zoo's one recipe (docs/ZOO.md, "Recipe"), sourced by train/zoo.sh and
# train/uptrain.sh so the uptrained model and the zoo it is compared with
# are trained alike. STEPS: the zoo's step count (the budget).
STEPS="${STEPS:-1000}"
ZOO_RECIPE=(--dim 64 --layers 6 --heads 4 --hidden 192 --ctx 256 --window 64 --passes 7 --grad-passes 2
	--batch 16 --lr 3e-3 --seed 1337 --eval-windows 16 --ckpt-every 10)
