#!/usr/bin/env bash
# The shared tier's cost on one replica when nothing is shared
# (docs/DEPLOY.md): two `kvlm serve` of stories260K, one with --kv-store on a
# loopback redis-server and one without, sent the same kind of request in
# turn (one at a time, the order swapped every pair), each prompt new to
# both (so every lookup misses and every block is written). cost.mjs prints
# the medians of TTFT and decode rate of each and their ratio.
#
#   KVLM_SHARED=/path/to/shared test/replicas/cost.sh [PAIRS]
#
# A measurement, not a check: run it alone on a quiet machine.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
shared=${KVLM_SHARED:-$repo/../shared}
model=$shared/models/stories260K/stories260K.bin
tok=$shared/models/stories260K/tok512.bin
[ -f "$model" ] || { echo "cost: $model not found (set KVLM_SHARED)" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/kvlm-cost.XXXXXX")
pids=()
cleanup() {
	local pid
	for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
	for pid in "${pids[@]}"; do
		for _ in $(seq 40); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
bin=${KVLM_BIN:-}
if [ -z "$bin" ]; then
	bin=$work/kvlm
	(cd "$repo" && go build -o "$bin" ./cmd/kvlm)
fi
(cd "$here" && npm ci --no-audit --no-fund --silent)
port=$(node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --maxmemory 256mb \
	--maxmemory-policy allkeys-lru --loglevel warning >"$work/redis.log" 2>&1 &
pids+=($!)
disown $!
for _ in $(seq 100); do
	redis-cli -p "$port" ping >/dev/null 2>&1 && break
	sleep 0.05
done
"$bin" serve -m "$model" --tokenizer "$tok" --addr 127.0.0.1:0 --served-model-name stories260K >"$work/off.log" 2>&1 &
pids+=($!)
disown $!
"$bin" serve -m "$model" --tokenizer "$tok" --addr 127.0.0.1:0 --served-model-name stories260K \
	--kv-store "redis://127.0.0.1:$port" >"$work/on.log" 2>&1 &
pids+=($!)
disown $!
url() {
	local u=""
	for _ in $(seq 300); do
		u=$(grep -o 'listening on http://[0-9.:]*' "$work/$1.log" | sed 's/listening on //') && [ -n "$u" ] && break
		sleep 0.05
	done
	[ -n "$u" ] || { cat "$work/$1.log" >&2; exit 1; }
	echo "$u"
}
KVLM_COST_OFF=$(url off) KVLM_COST_ON=$(url on) KVLM_COST_TEXT=$shared/data/tinystories_valid_head.txt \
	KVLM_COST_PAIRS=${1:-40} node "$here/cost.mjs"
