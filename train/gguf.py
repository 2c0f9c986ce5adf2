"""A minimal GGUF v3 reader and writer: typed metadata and F32 tensors.

Only what the trainer needs: it reads the tokenizer metadata out of the GGUF
`kvlm convert llama2c` writes (so the zoo's vocabulary is byte for byte the
one kvlm's convert writes) and the weights of such a file, and it writes a
model. The layout is the GGUF specification's: a header (magic, version,
tensor count, metadata count), the metadata key/value pairs, the tensor
infos (name, dims innermost first, type, offset), padding to the alignment,
then the tensor data, each tensor aligned.
"""

import struct

import numpy as np

MAGIC = b"GGUF"
VERSION = 3
ALIGN = 32

# Metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
_SCALAR = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}
GGML_F32 = 0


class Value:
    """A typed metadata value: typ is a scalar type, STRING, or ARRAY with
    elem the items' type."""

    def __init__(self, typ, value, elem=None):
        self.typ, self.value, self.elem = typ, value, elem

    def __repr__(self):
        return f"Value({self.typ}, {self.value!r}, {self.elem})"


def u32(v):
    return Value(UINT32, int(v))


def f32(v):
    return Value(FLOAT32, float(v))


def string(v):
    return Value(STRING, str(v))


def u64(v):
    return Value(UINT64, int(v))


def i32s(v):
    return Value(ARRAY, [int(x) for x in v], INT32)


def u32s(v):
    return Value(ARRAY, [int(x) for x in v], UINT32)


class _Reader:
    def __init__(self, data):
        self.d, self.o = data, 0

    def take(self, n):
        if self.o + n > len(self.d):
            raise ValueError(f"gguf: truncated at offset {self.o} (want {n} bytes)")
        b = self.d[self.o:self.o + n]
        self.o += n
        return b

    def scalar(self, typ):
        fmt = _SCALAR[typ]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar(UINT64)
        return self.take(n).decode("utf-8")

    def value(self, typ):
        if typ == STRING:
            return Value(STRING, self.string())
        if typ == ARRAY:
            elem = self.scalar(UINT32)
            n = self.scalar(UINT64)
            if elem == STRING:
                return Value(ARRAY, [self.string() for _ in range(n)], elem)
            if elem not in _SCALAR:
                raise ValueError(f"gguf: array of type {elem} is not supported")
            fmt = _SCALAR[elem]
            size = struct.calcsize(fmt)
            return Value(ARRAY, list(struct.unpack("<" + fmt[1] * n, self.take(size * n))), elem)
        if typ not in _SCALAR:
            raise ValueError(f"gguf: value type {typ} is not supported")
        return Value(typ, self.scalar(typ))


def read(path):
    """Returns (metadata {key: Value}, tensors {name: np.ndarray float32 in
    the row-major shape [dims reversed]}). Only F32 tensors are decoded."""
    with open(path, "rb") as f:
        data = f.read()
    r = _Reader(data)
    if r.take(4) != MAGIC:
        raise ValueError(f"{path}: not a GGUF file")
    version = r.scalar(UINT32)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    nt, nkv = r.scalar(UINT64), r.scalar(UINT64)
    meta = {}
    for _ in range(nkv):
        key = r.string()
        meta[key] = r.value(r.scalar(UINT32))
    infos = []
    for _ in range(nt):
        name = r.string()
        nd = r.scalar(UINT32)
        dims = [r.scalar(UINT64) for _ in range(nd)]
        typ, off = r.scalar(UINT32), r.scalar(UINT64)
        infos.append((name, dims, typ, off))
    align = meta["general.alignment"].value if "general.alignment" in meta else ALIGN
    base = (r.o + align - 1) // align * align
    tensors = {}
    for name, dims, typ, off in infos:
        if typ != GGML_F32:
            raise ValueError(f"{path}: tensor {name} has type {typ}; only F32 is read")
        n = int(np.prod(dims))
        a = np.frombuffer(data, dtype="<f4", count=n, offset=base + off)
        tensors[name] = a.reshape(list(reversed(dims))).copy()
    return meta, tensors


def _pack_value(v):
    out = [struct.pack("<I", v.typ)]
    if v.typ == STRING:
        b = v.value.encode("utf-8")
        out.append(struct.pack("<Q", len(b)) + b)
    elif v.typ == ARRAY:
        out.append(struct.pack("<IQ", v.elem, len(v.value)))
        if v.elem == STRING:
            for s in v.value:
                b = s.encode("utf-8")
                out.append(struct.pack("<Q", len(b)) + b)
        else:
            out.append(struct.pack("<" + _SCALAR[v.elem][1] * len(v.value), *v.value))
    else:
        out.append(struct.pack(_SCALAR[v.typ], v.value))
    return b"".join(out)


def write(path, meta, tensors):
    """Writes metadata ({key: Value}, in order) and F32 tensors ({name:
    array}, in order; a row-major array of shape [r, c] is GGUF dims [c, r])."""
    head = [MAGIC, struct.pack("<IQQ", VERSION, len(tensors), len(meta))]
    for k, v in meta.items():
        kb = k.encode("utf-8")
        head.append(struct.pack("<Q", len(kb)) + kb + _pack_value(v))
    blobs, off = [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        nb = name.encode("utf-8")
        dims = list(reversed(a.shape))
        head.append(struct.pack("<Q", len(nb)) + nb + struct.pack("<I", len(dims)) +
                    struct.pack("<" + "Q" * len(dims), *dims) + struct.pack("<IQ", GGML_F32, off))
        b = a.tobytes()
        pad = (-len(b)) % ALIGN
        blobs.append(b + b"\0" * pad)
        off += len(b) + pad
    h = b"".join(head)
    h += b"\0" * ((-len(h)) % ALIGN)
    with open(path, "wb") as f:
        f.write(h)
        for b in blobs:
            f.write(b)
