#!/usr/bin/env bash
# The local multi-replica test (docs/DEPLOY.md): redis-server, three
# `kvlm serve` replicas sharing prefix KV through it (--kv-store, --kv-events)
# and haproxy in front, driven by the official openai client for Node
# (drive.mjs: baseline, shared system prompt and TTFT, Redis killed and
# restarted, a replica killed, every greedy output against the baseline).
#
#   KVLM_SHARED=/path/to/shared test/replicas/run.sh
#
# Loopback only; every port is chosen free at run time (the replicas take
# port 0 and print theirs); every process this script or the driver starts
# is killed on exit (pid files under the work folder). Prints the driver's
# JSON summary; exits non-zero when a check fails. $KVLM_BIN: the kvlm
# binary (default: built here). $KVLM_REPLICAS_JSON: also write the summary
# to that file. Needs redis-server, haproxy, node, npm.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
shared=${KVLM_SHARED:-$repo/../shared}
model=$shared/models/stories260K/stories260K.bin
tok=$shared/models/stories260K/tok512.bin
text=$shared/data/tinystories_valid_head.txt

for tool in redis-server:redis-server haproxy:haproxy node:nodejs npm:npm; do
	if ! command -v "${tool%%:*}" >/dev/null; then
		echo "replicas: ${tool%%:*} not found (apt-get install ${tool#*:})" >&2
		exit 1
	fi
done
for f in "$model" "$tok" "$text"; do
	[ -f "$f" ] || { echo "replicas: $f not found (set KVLM_SHARED)" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/kvlm-replicas.XXXXXX")
mkdir -p "$work/pids" "$work/logs"
cleanup() {
	local f pid
	for f in "$work"/pids/*; do
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		kill -TERM "$pid" 2>/dev/null || true
	done
	sleep 0.3
	for f in "$work"/pids/*; do
		[ -f "$f" ] || continue
		pid=$(cat "$f")
		kill -KILL "$pid" 2>/dev/null || true
		for _ in $(seq 40); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.05
		done
	done
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail_logs() {
	echo "replicas: $1; logs:" >&2
	tail -n 20 "$work"/logs/* >&2 || true
	exit 1
}

# A free loopback port: bound to 0 and released (redis-server and haproxy
# need a number; the kvlm replicas take port 0 themselves).
freeport() {
	node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'
}

bin=${KVLM_BIN:-}
if [ -z "$bin" ]; then
	bin=$work/kvlm
	(cd "$repo" && go build -o "$bin" ./cmd/kvlm)
fi
(cd "$here" && npm ci --no-audit --no-fund --silent)

# The shared tier and the KV events, used when this binary has them: the
# driver skips the steps that need --kv-store without it (and fails under
# CI).
help=$("$bin" serve --help)
store=0
events=0
grep -q -- '--kv-store ' <<<"$help" && store=1
grep -q -- '--kv-events ' <<<"$help" && events=1

redis_port=$(freeport)
redis_cmd=(redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no
	--maxmemory 64mb --maxmemory-policy allkeys-lru --protected-mode yes --loglevel warning)
# Each process starts in a subshell, not as a job of this shell (so no
# "Killed" line when the driver kills one); the pid files are what cleanup
# kills.
("${redis_cmd[@]}" >"$work/logs/redis" 2>&1 & echo $! >"$work/pids/redis")
for _ in $(seq 100); do
	redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
	sleep 0.05
done
redis-cli -p "$redis_port" ping >/dev/null 2>&1 || fail_logs "redis-server did not start"

# start NAME ARGS...: one kvlm serve on a free port (wait_url NAME prints
# its URL once it listens).
start() {
	local name=$1
	shift
	("$bin" serve -m "$model" --tokenizer "$tok" --addr 127.0.0.1:0 --served-model-name stories260K "$@" \
		>"$work/logs/$name" 2>&1 & echo $! >"$work/pids/$name")
}
wait_url() {
	local name=$1 url=""
	for _ in $(seq 300); do
		url=$(grep -o 'listening on http://[0-9.:]*' "$work/logs/$name" | head -n1 | sed 's/listening on //') || true
		[ -n "$url" ] && break
		kill -0 "$(cat "$work/pids/$name")" 2>/dev/null || fail_logs "$name exited"
		sleep 0.05
	done
	[ -n "$url" ] || fail_logs "$name did not start"
	echo "$url"
}

# The single-replica baseline: no shared tier, nothing else running on it.
start solo
urls=()
ports=()
for i in 0 1 2; do
	args=()
	# A lookup or a write waits up to 1s (default 50ms): this machine's
	# cores are shared, and a lookup past its timeout is a miss, which
	# step 2 would count as wrong.
	[ "$store" = 1 ] && args+=(--kv-store "redis://127.0.0.1:$redis_port" --kv-store-timeout 1s)
	[ "$events" = 1 ] && args+=(--kv-events "tcp://127.0.0.1:$(freeport)")
	start "r$i" "${args[@]}"
done
solo_url=$(wait_url solo)
for i in 0 1 2; do
	urls+=("$(wait_url "r$i")")
	ports+=("${urls[$i]##*:}")
done

# haproxy: round robin; health checks on /health every 100-200ms, down
# after 2 failures, up after 2 successes; a request is retried on another
# replica only when its connection could not be made (retry-on
# conn-failure: nothing reached a replica, so nothing is generated twice);
# a request a replica dies under fails to its client (502 or a cut stream).
# No idle connection to a replica is reused (http-reuse never): a request
# sent on a reused connection whose replica just died is neither retried nor
# answered (haproxy closes the client's connection, as for a keep-alive
# race), while a new connection to a dead replica is refused and retried.
lb_port=$(freeport)
cat >"$work/haproxy.cfg" <<EOF
global
	maxconn 256
	stats socket $work/haproxy.sock mode 600 level admin
defaults
	mode http
	timeout connect 1s
	timeout client 60s
	timeout server 60s
	retries 2
	option redispatch 1
	retry-on conn-failure
	http-reuse never
frontend fe
	bind 127.0.0.1:$lb_port
	default_backend kvlm
backend kvlm
	balance roundrobin
	option httpchk
	http-check send meth GET uri /health ver HTTP/1.1 hdr Host localhost
	http-check expect status 200
	default-server check inter 200ms fastinter 100ms downinter 200ms fall 2 rise 2
	http-response set-header X-Kvlm-Replica %s
	server r0 127.0.0.1:${ports[0]}
	server r1 127.0.0.1:${ports[1]}
	server r2 127.0.0.1:${ports[2]}
EOF
haproxy -c -q -f "$work/haproxy.cfg" || fail_logs "haproxy rejects its configuration"
(haproxy -db -f "$work/haproxy.cfg" >"$work/logs/haproxy" 2>&1 & echo $! >"$work/pids/haproxy")
for _ in $(seq 100); do
	[ -S "$work/haproxy.sock" ] && break
	sleep 0.05
done

export KVLM_REPLICAS_WORK=$work
export KVLM_REPLICAS_SOLO=$solo_url
export KVLM_REPLICAS_URLS=$(IFS=,; echo "${urls[*]}")
export KVLM_REPLICAS_PIDS=$(cat "$work/pids/r0"),$(cat "$work/pids/r1"),$(cat "$work/pids/r2")
export KVLM_REPLICAS_LB=http://127.0.0.1:$lb_port
export KVLM_REPLICAS_HAPROXY_SOCK=$work/haproxy.sock
export KVLM_REPLICAS_REDIS_PORT=$redis_port
export KVLM_REPLICAS_REDIS_CMD=$(printf '%s\n' "${redis_cmd[@]}")
export KVLM_REPLICAS_STORE=$store
export KVLM_REPLICAS_EVENTS=$events
export KVLM_REPLICAS_TEXT=$text
if ! node "$here/drive.mjs"; then
	fail_logs "the driver failed"
fi
