"""A small GGUF (v2/v3) reader with numpy dequantisation.

Layout of a GGUF file (all little-endian):

    magic "GGUF" | version u32 | n_tensors u64 | n_kv u64
    n_kv x  (key: string, value_type: u32, value)
    n_tensors x (name: string, n_dims: u32, ne: u64[n_dims], ggml_type: u32, offset: u64)
    padding to `general.alignment` (default 32)
    tensor data; tensor i lives at data_offset + offset_i

A string is a u64 byte length followed by UTF-8 bytes; an array is an element
value_type u32, a u64 count and the elements.

Dimensions are stored fastest-varying first: ne[0] is the length of a row. A
2-D weight with ne = [n_in, n_out] is therefore a row-major numpy array of
shape (n_out, n_in), i.e. `W @ x` maps n_in -> n_out. `Tensor.shape` gives the
numpy (row-major) shape, the reverse of ne.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# metadata value types
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)

_SCALAR_FMT = {
    UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
    FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d",
}
_SCALAR_NP = {
    UINT8: "<u1", INT8: "<i1", UINT16: "<u2", INT16: "<i2", UINT32: "<u4", INT32: "<i4",
    FLOAT32: "<f4", BOOL: "<u1", UINT64: "<u8", INT64: "<i8", FLOAT64: "<f8",
}

# ggml tensor types (the subset this reader dequantises, plus names for the rest)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1 = 0, 1, 2, 3
GGML_Q5_0, GGML_Q5_1, GGML_Q8_0 = 6, 7, 8
GGML_BF16 = 30

GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
    16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
    22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
    29: "IQ1_M", 30: "BF16",
}

# (elements per block, bytes per block)
GGML_BLOCK = {
    GGML_F32: (1, 4),
    GGML_F16: (1, 2),
    GGML_BF16: (1, 2),
    GGML_Q4_0: (32, 2 + 16),
    GGML_Q4_1: (32, 2 + 2 + 16),
    GGML_Q5_0: (32, 2 + 4 + 16),
    GGML_Q5_1: (32, 2 + 2 + 4 + 16),
    GGML_Q8_0: (32, 2 + 32),
}


class GGUFError(ValueError):
    pass


@dataclass
class Tensor:
    name: str
    ne: tuple            # dims as stored: ne[0] fastest-varying (row length)
    ggml_type: int
    offset: int          # relative to the data section
    data: np.ndarray     # raw bytes (uint8 view into the memmap)

    @property
    def shape(self) -> tuple:
        """numpy (row-major) shape: reversed ne."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return GGML_TYPE_NAMES.get(self.ggml_type, f"type{self.ggml_type}")

    def numpy(self, dtype=np.float32) -> np.ndarray:
        """Dequantised copy with numpy shape `self.shape`."""
        flat = dequantize(self.data, self.ggml_type, self.n_elements)
        return flat.reshape(self.shape).astype(dtype, copy=False)


def nbytes_for(ggml_type: int, n_elements: int) -> int:
    if ggml_type not in GGML_BLOCK:
        raise GGUFError(f"unsupported ggml type {GGML_TYPE_NAMES.get(ggml_type, ggml_type)}")
    blk, size = GGML_BLOCK[ggml_type]
    if n_elements % blk:
        raise GGUFError(f"{n_elements} elements is not a multiple of the block size {blk}")
    return n_elements // blk * size


# ---------------------------------------------------------------- dequantisation

def _blocks(raw: np.ndarray, n_elements: int, block_bytes: int) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    nb = n_elements // 32
    if raw.size < nb * block_bytes:
        raise GGUFError("tensor data is truncated")
    return raw[: nb * block_bytes].reshape(nb, block_bytes)


def _f16(b: np.ndarray) -> np.ndarray:
    """(nb, 2) uint8 -> (nb, 1) float32 from little-endian fp16."""
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(nb, 16) packed bytes -> (nb, 32): low nibbles are elements 0-15, high 16-31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(nb, 4) bytes of a u32 -> (nb, 32) bit j of the u32 for element j."""
    u = np.ascontiguousarray(qh).view("<u4")  # (nb, 1)
    return ((u >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def dequant_q4_0(raw, n):
    b = _blocks(raw, n, 18)
    d = _f16(b[:, 0:2])
    q = _nibbles(b[:, 2:18]).astype(np.float32) - 8.0
    return (d * q).reshape(-1)


def dequant_q4_1(raw, n):
    b = _blocks(raw, n, 20)
    d = _f16(b[:, 0:2])
    m = _f16(b[:, 2:4])
    q = _nibbles(b[:, 4:20]).astype(np.float32)
    return (d * q + m).reshape(-1)


def dequant_q5_0(raw, n):
    b = _blocks(raw, n, 22)
    d = _f16(b[:, 0:2])
    q = (_nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4)).astype(np.float32) - 16.0
    return (d * q).reshape(-1)


def dequant_q5_1(raw, n):
    b = _blocks(raw, n, 24)
    d = _f16(b[:, 0:2])
    m = _f16(b[:, 2:4])
    q = (_nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)).astype(np.float32)
    return (d * q + m).reshape(-1)


def dequant_q8_0(raw, n):
    b = _blocks(raw, n, 34)
    d = _f16(b[:, 0:2])
    q = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw tensor bytes -> flat float32 array of n_elements (ggml element order)."""
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if ggml_type == GGML_F32:
        return raw[: 4 * n_elements].view("<f4").astype(np.float32)
    if ggml_type == GGML_F16:
        return raw[: 2 * n_elements].view("<f2").astype(np.float32)
    if ggml_type == GGML_BF16:
        u = raw[: 2 * n_elements].view("<u2").astype(np.uint32) << 16
        return u.view(np.float32)
    fn = {
        GGML_Q4_0: dequant_q4_0, GGML_Q4_1: dequant_q4_1, GGML_Q5_0: dequant_q5_0,
        GGML_Q5_1: dequant_q5_1, GGML_Q8_0: dequant_q8_0,
    }.get(ggml_type)
    if fn is None:
        raise GGUFError(f"dequantisation of {GGML_TYPE_NAMES.get(ggml_type, ggml_type)} is not implemented")
    if n_elements % 32:
        raise GGUFError(f"{n_elements} elements is not a multiple of 32")
    return fn(raw, n_elements)


# ---------------------------------------------------------------- reader

class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf = buf
        self.pos = 0

    def read(self, fmt: str):
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.read("<Q")
        s = bytes(self.buf[self.pos:self.pos + n])
        if len(s) != n:
            raise GGUFError("truncated string")
        self.pos += n
        return s.decode("utf-8", errors="surrogateescape")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FMT:
            return self.read(_SCALAR_FMT[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.read("<I")
            count = self.read("<Q")
            if etype in _SCALAR_NP:
                dt = np.dtype(_SCALAR_NP[etype])
                nbytes = dt.itemsize * count
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
                self.pos += nbytes
                if etype == BOOL:
                    arr = arr.astype(bool)
                return arr
            return [self.value(etype) for _ in range(count)]
        raise GGUFError(f"unknown metadata value type {vtype} at byte {self.pos}")


class GGUFReader:
    """Parses a GGUF file; tensor data stays memory-mapped.

    Attributes: version, metadata (dict key -> value; arrays of numbers are
    numpy arrays, arrays of strings are lists), metadata_types (key ->
    value_type, and for arrays (ARRAY, element_type)), tensors (dict name ->
    Tensor, in file order), alignment, data_offset.
    """

    def __init__(self, path: str):
        self.path = str(path)
        self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = memoryview(self._mm)
        if len(buf) < 24 or bytes(buf[:4]) != GGUF_MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file")
        c = _Cursor(buf)
        c.pos = 4
        self.version = c.read("<I")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: unsupported GGUF version {self.version}")
        n_tensors = c.read("<Q")
        n_kv = c.read("<Q")

        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, Any] = {}
        for _ in range(n_kv):
            key = c.string()
            vtype = c.read("<I")
            if vtype == ARRAY:
                etype = struct.unpack_from("<I", buf, c.pos)[0]
                self.metadata_types[key] = (ARRAY, etype)
            else:
                self.metadata_types[key] = vtype
            self.metadata[key] = c.value(vtype)

        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.read("<I")
            ne = tuple(c.read("<Q") for _ in range(n_dims))
            gtype = c.read("<I")
            off = c.read("<Q")
            infos.append((name, ne, gtype, off))

        self.alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"bad general.alignment {self.alignment}")
        a = self.alignment
        self.data_offset = (c.pos + a - 1) // a * a

        self.tensors: dict[str, Tensor] = {}
        for name, ne, gtype, off in infos:
            n = 1
            for d in ne:
                n *= d
            nbytes = nbytes_for(gtype, n) if gtype in GGML_BLOCK else 0
            start = self.data_offset + off
            if gtype in GGML_BLOCK and start + nbytes > len(self._mm):
                raise GGUFError(f"tensor {name} runs past the end of the file")
            self.tensors[name] = Tensor(name, ne, gtype, off, self._mm[start:start + nbytes])

    def get(self, key: str, default=None):
        return self.metadata.get(key, default)

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        return self.tensors[name].numpy(dtype)

    def type_summary(self) -> dict:
        """ggml type name -> number of tensors of that type."""
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.type_name] = out.get(t.type_name, 0) + 1
        return out
