#!/usr/bin/python3
"""An independent subscriber of kvlm's KV events: pyzmq and msgpack, as a
vLLM consumer reads them (vLLM's examples/online_serving/kv_events_subscriber.py
reads the same three frames, and asks the replay socket for what it missed).

Usage: subscriber.py PUB_ENDPOINT REPLAY_ENDPOINT TOPIC FORMAT(array|map)

It prints "ready" once connected, reads live messages until a line "done"
arrives on stdin, then asks the replay socket for every batch from sequence 0
and checks that each live batch is the replayed one byte for byte. It prints
one JSON line per batch (seq, live, ts, data_parallel_rank, events with vLLM's
field names, hashes as decimal strings), and exits 1 with a message on anything that is not vLLM's
format.
"""
import json
import sys

import msgpack
import zmq

FIELDS = {
    "BlockStored": ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def fail(msg):
    print("subscriber: " + msg, file=sys.stderr)
    sys.exit(1)


def event(e, fmt):
    """One event as a dict of vLLM's field names, checked against its format."""
    if fmt == "array":
        if not isinstance(e, list) or not e or e[0] not in FIELDS:
            fail("array event %r" % (e,))
        names = FIELDS[e[0]]
        if len(e) != len(names) + 1:
            fail("%s with %d fields, want %d" % (e[0], len(e) - 1, len(names)))
        out = dict(zip(names, e[1:]))
        out["type"] = e[0]
    else:
        if not isinstance(e, dict) or e.get("type") not in FIELDS:
            fail("map event %r" % (e,))
        if set(e) != set(FIELDS[e["type"]]) | {"type"}:
            fail("%s with keys %s" % (e["type"], sorted(e)))
        out = dict(e)
    for h in out.get("block_hashes", []):
        if not isinstance(h, int) or not 0 <= h < 1 << 64:
            fail("block hash %r is not a 64-bit unsigned integer" % (h,))
    if out["type"] == "BlockStored":
        p = out["parent_block_hash"]
        if p is not None and not isinstance(p, int):
            fail("parent_block_hash %r" % (p,))
        if len(out["token_ids"]) != len(out["block_hashes"]) * out["block_size"]:
            fail("%d token ids for %d blocks of %d" % (len(out["token_ids"]), len(out["block_hashes"]), out["block_size"]))
    return out


def batch(payload, fmt):
    b = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    if not isinstance(b, list) or len(b) != 3 or not isinstance(b[0], float) or not isinstance(b[1], list):
        fail("batch %r is not [ts, events, data_parallel_rank]" % (b,))
    return {"ts": b[0], "data_parallel_rank": b[2], "events": [event(e, fmt) for e in b[1]]}


def printable(e):
    """The event for JSON, its 64-bit hashes as decimal strings (exact)."""
    out = dict(e)
    if "block_hashes" in out:
        out["block_hashes"] = [str(h) for h in out["block_hashes"]]
    if out.get("parent_block_hash") is not None:
        out["parent_block_hash"] = str(out["parent_block_hash"])
    return out


def main():
    pub_ep, replay_ep, topic, fmt = sys.argv[1:5]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(pub_ep)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    # vLLM's example asks with a REQ socket, which takes one answer per
    # request; the ROUTER answers with one message per batch, so a DEALER
    # (sending the empty delimiter a REQ would add) reads them all.
    replay = ctx.socket(zmq.DEALER)
    replay.connect(replay_ep)
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    poller.register(sys.stdin, zmq.POLLIN)
    print("ready", flush=True)
    live = {}
    done = False
    while True:
        ready = dict(poller.poll(300 if done else 10000))
        if sub in ready:
            frames = sub.recv_multipart()
            if len(frames) != 3 or frames[0] != topic.encode() or len(frames[1]) != 8:
                fail("message %r is not [topic, 8-byte seq, payload]" % (frames[:2],))
            live[int.from_bytes(frames[1], "big")] = frames[2]
            continue
        if done:
            break  # 300 ms without a message after "done"
        if sys.stdin.fileno() in ready or sys.stdin in ready:
            if sys.stdin.readline().strip() == "done":
                done = True
            continue
        fail("nothing for 10 s")
    # Everything from sequence 0, as a subscriber that missed the start asks.
    replay.send_multipart([b"", (0).to_bytes(8, "big")])
    replayed = {}
    while True:
        if not replay.poll(5000):
            fail("no replay answer")
        frames = replay.recv_multipart()
        if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
            fail("replay answer %r is not [\"\", 8-byte seq, payload]" % (frames[:2],))
        _, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq == -1:
            if payload:
                fail("end marker with a payload")
            break
        replayed[seq] = payload
    if sorted(replayed) != list(range(len(replayed))):
        fail("replayed sequences %s are not 0..n-1" % sorted(replayed))
    for seq, payload in live.items():
        if replayed.get(seq) != payload:
            fail("live batch %d differs from its replay" % seq)
    for seq in sorted(replayed):
        b = batch(replayed[seq], fmt)
        b["seq"] = seq
        b["live"] = seq in live
        b["events"] = [printable(e) for e in b["events"]]
        print(json.dumps(b), flush=True)


main()
