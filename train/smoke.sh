#!/usr/bin/env bash
# CI smoke test of the trainer: trains a micro model (width 32, 6 layers,
# context 64) of every KV architecture for 3 steps, exports each, runs the
# trainer's unit tests, then checks kvlm's logits and held-out NLL against
# PyTorch's on the exported files (cmd/kvlm TestZoo with KVLM_ZOO).
# Needs Debian's python3-torch and libopenblas0-pthread (.ci/run installs
# them) and $KVLM_SHARED.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export KVLM_BIN="$out/kvlm"
go build -o "$KVLM_BIN" ./cmd/kvlm
/usr/bin/python3 -c 'import torch; print("torch", torch.__version__)'
for a in mha gqa mqa cla2 cla3 cla2-mqa yoco lckv local-global; do
	/usr/bin/python3 train/train.py --arch "$a" --out "$out/zoo/$a" --dim 32 --layers 6 --heads 4 --hidden 64 \
		--ctx 64 --window 16 --passes 3 --grad-passes 2 --batch 4 --steps 3 --eval-windows 2 --threads 2 \
		--log-every 1 >"$out/$a.log"
	tail -n 1 "$out/$a.log"
done
/usr/bin/python3 -m unittest discover -s train
KVLM_ZOO="$out/zoo" go test -count=1 -run '^TestZoo$' -v ./cmd/kvlm/ | grep -v '^=== RUN'
