#!/usr/bin/env bash
# Train zoo models into train/zoo/ARCH, one after another, niced, with the
# zoo's one recipe (the same width, depth, context, batch and token count
# for every architecture). Usage: train/zoo.sh ARCH... (default: all).
# STEPS overrides the step count (the recipe's budget; see docs/ZOO.md),
# THREADS the torch threads of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${STEPS:-1000}"
THREADS="${THREADS:-2}"
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(mha gqa mqa cla2 cla3 cla2-mqa yoco lckv local-global)
for a in "${archs[@]}"; do
	if [ -f "train/zoo/$a/model.gguf" ]; then
		echo "$a: train/zoo/$a/model.gguf exists; skipped"
		continue
	fi
	resume=()
	[ -f "train/zoo/$a/ckpt.pt" ] && resume=(--resume)
	nice -n 10 /usr/bin/python3 train/train.py --arch "$a" --out "train/zoo/$a" \
		--dim 64 --layers 6 --heads 4 --hidden 192 --ctx 256 --window 64 --passes 7 --grad-passes 2 \
		--batch 16 --steps "$STEPS" --lr 3e-3 --seed 1337 --threads "$THREADS" \
		--eval-windows 16 --ckpt-every 10 --log-every 5 "${resume[@]}"
done
