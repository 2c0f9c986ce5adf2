#!/usr/bin/env bash
# Train zoo models into train/zoo/ARCH, one after another, niced, with the
# zoo's one recipe (the same width, depth, context, batch and token count
# for every architecture). Usage: train/zoo.sh ARCH... (default: all).
# STEPS overrides the step count (train/zoo_recipe.sh: the recipe and its budget),
# THREADS the torch threads of each run.
set -euo pipefail
cd "$(dirname "$0")/.."
. train/zoo_recipe.sh
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
	nice -n 10 /usr/bin/python3 train/train.py --arch "$a" --out "train/zoo/$a" "${ZOO_RECIPE[@]}" \
		--steps "$STEPS" --threads "$THREADS" --log-every 5 "${resume[@]}"
done
