"""The trainer's data: TinyStories text split at fixed byte offsets, and
tok512 token ids produced by kvlm itself (`kvlm tokenize`), so that the
trainer and kvlm tokenize identically.

Split of $KVLM_SHARED/data/tinystories_valid_head.txt (794,375 bytes):
  train     bytes [0, 700043)       (the first 700,000 bytes, extended to
                                     the end of the paragraph: "\\n\\n")
  held-out  bytes [700043, 794375)  (from the paragraph starting "Once upon a
                                     time, there was a little girl. She
                                     liked to have fun and play." to the end)
Neither part is read for the other's purpose.
"""

import hashlib
import json
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(ROOT, "train", ".cache")

TEXT = "data/tinystories_valid_head.txt"
TEXT_BYTES = 794375
TRAIN = (0, 700043)
HELDOUT = (700043, 794375)
BOS = 1


def shared():
    return os.environ.get("KVLM_SHARED") or os.path.join(os.path.dirname(ROOT), "shared")


def tok512_path():
    return os.path.join(shared(), "models/stories260K/tok512.bin")


def kvlm_bin():
    """The kvlm binary: $KVLM_BIN, or built once into train/.cache/kvlm."""
    b = os.environ.get("KVLM_BIN")
    if b:
        return b
    b = os.path.join(CACHE, "kvlm")
    if not os.path.exists(b):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run(["go", "build", "-o", b, "./cmd/kvlm"], cwd=ROOT, check=True)
    return b


def text_bytes(lo, hi):
    path = os.path.join(shared(), TEXT)
    with open(path, "rb") as f:
        data = f.read()
    if len(data) != TEXT_BYTES:
        raise SystemExit(f"{path} has {len(data)} bytes, want {TEXT_BYTES}: the split offsets are for that file")
    return data[lo:hi]


def tokenize(data):
    """kvlm's tok512 ids of data (UTF-8 bytes), no BOS; cached by content hash."""
    key = hashlib.sha256(data).hexdigest()[:16]
    path = os.path.join(CACHE, f"tok512-{key}.json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["ids"]
    out = subprocess.run([kvlm_bin(), "tokenize", "--tokenizer", tok512_path(), "--json", "-"],
                         input=data, capture_output=True, check=True).stdout
    ids = json.loads(out)["ids"]
    os.makedirs(CACHE, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump({"ids": ids}, f)
    os.replace(path + ".tmp", path)
    return ids


def split_ids():
    """(train ids, held-out ids) of the two byte ranges, each tokenized on its own."""
    return tokenize(text_bytes(*TRAIN)), tokenize(text_bytes(*HELDOUT))


def heldout_windows(ids, ctx, count):
    """count consecutive windows of the held-out ids, each BOS followed by
    the next ctx−1 ids (kvlm ppl's form: encode with BOS, score the ctx−1
    predictions)."""
    n = ctx - 1
    if len(ids) < count * n:
        raise SystemExit(f"held-out part has {len(ids)} tokens, fewer than {count} windows of {n}")
    return [[BOS] + ids[k * n:(k + 1) * n] for k in range(count)]


def vocab_metadata():
    """The tokenizer.ggml.* metadata exactly as `kvlm convert llama2c` writes
    it for tok512 (convert.VocabMetadata), read from a conversion of
    stories260K."""
    import gguf
    path = os.path.join(CACHE, "stories260K.gguf")
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        s = shared()
        subprocess.run([kvlm_bin(), "convert", "llama2c", "--model", os.path.join(s, "models/stories260K/stories260K.bin"),
                        "--tokenizer", tok512_path(), "-o", path], check=True, capture_output=True)
    meta, _ = gguf.read(path)
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
