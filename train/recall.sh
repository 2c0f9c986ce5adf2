#!/bin/sh
# The recall model (docs/ZOO.md, "The recall model"): a fresh GQA model,
# head dim 32, context 512, trained on story windows mixed half and half
# with recall-suite samples (train/recall.py). Resumable: RESUME=1.
set -e
cd "$(dirname "$0")/.."
OUT=${OUT:-train/recall}
export OMP_WAIT_POLICY=PASSIVE
exec /usr/bin/python3 train/train.py --arch gqa --dim 128 --layers 4 --heads 4 --hidden 384 --ctx 512 \
    --batch 8 --steps ${STEPS:-1400} --lr 3e-3 --seed 1337 --threads 2 --eval-windows 16 \
    --recall 0.5 --recall-weight 1 --recall-pool 2000 --recall-eval-every 150 --recall-eval-n 12 \
    --ckpt-every 100 --log-every 20 --out "$OUT" ${RESUME:+--resume} "$@"
