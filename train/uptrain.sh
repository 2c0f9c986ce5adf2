#!/usr/bin/env bash
# MHA→GQA uptraining (arXiv 2305.13245) on the zoo: convert train/zoo/mha to
# 2 KV heads with kvlm's own converter (mean-pooled K/V heads), then train
# the converted model for 5% of the zoo's steps (STEPS, as train/zoo.sh took
# it; 5% rounded up: 50 of 1,000) with the zoo's recipe otherwise, into
# train/zoo/mha-to-gqa. Its record holds the
# converted-only held-out NLL (init_heldout_nll) and the uptrained one.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${KVLM_BIN:-train/.cache/kvlm}"
[ -x "$bin" ] || { mkdir -p train/.cache && go build -o "$bin" ./cmd/kvlm; }
export KVLM_BIN="$bin"
conv=train/.cache/mha-kv2.gguf
. train/zoo_recipe.sh
up=$(( (STEPS * 5 + 99) / 100 ))
"$bin" convert kv-heads train/zoo/mha/model.gguf --kv-heads 2 -o "$conv"
nice -n 10 /usr/bin/python3 train/train.py --arch gqa --init "$conv" --out train/zoo/mha-to-gqa "${ZOO_RECIPE[@]}" \
	--steps "$up" --threads "${THREADS:-2}" --log-every 5
