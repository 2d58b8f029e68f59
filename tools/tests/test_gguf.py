"""pqmodel.gguf (the gguf package underneath) on a file the test writes byte
by byte, and dequantisation of hand-built blocks: the format as the numpy
model expects it, pinned independently of the package (whose own writer
cannot write an empty array or keep the element type of nested ones).

These tests never need the model file."""

import struct

import numpy as np
import pytest

from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as V

from pqmodel.gguf import GGUFError, GGUFReader, dequantize


# ------------------------------------------------------------------ tiny writer
def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


_FMT = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I",
        V.INT32: "<i", V.FLOAT32: "<f", V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q",
        V.FLOAT64: "<d"}


def _val(vtype, v) -> bytes:
    if vtype == V.STRING:
        return _str(v)
    if vtype == V.ARRAY:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_val(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


def write_gguf(path, kvs, tensors, alignment=None):
    """kvs: list of (key, vtype, value); tensors: list of (name, ne, ggml_type, raw bytes)."""
    if alignment is not None:
        kvs = kvs + [("general.alignment", V.UINT32, alignment)]
    align = alignment or 32
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, t, v in kvs:
        out += _str(k) + struct.pack("<I", t) + _val(t, v)
    offs, off = [], 0
    for name, ne, gt, raw in tensors:
        offs.append(off)
        off = (off + len(raw) + align - 1) // align * align
    for (name, ne, gt, raw), o in zip(tensors, offs):
        out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        out += struct.pack("<IQ", gt, o)
    out += b"\0" * ((-len(out)) % align)
    base = len(out)
    for (name, ne, gt, raw), o in zip(tensors, offs):
        out += b"\0" * (base + o - len(out))
        out += raw
    with open(path, "wb") as f:
        f.write(out)
    return base


def q8_0_block(d: float, qs) -> bytes:
    return np.float16(d).tobytes() + np.asarray(qs, np.int8).tobytes()


def q4_1_block(d: float, m: float, q) -> bytes:
    """q: 32 values 0..15; element j<16 goes to the low nibble of byte j, j>=16 to the high nibble of byte j-16."""
    q = np.asarray(q, np.uint8)
    packed = (q[:16] & 0xF) | ((q[16:] & 0xF) << 4)
    return np.float16(d).tobytes() + np.float16(m).tobytes() + packed.astype(np.uint8).tobytes()


KVS = [
    ("general.architecture", V.STRING, "llama"),
    ("test.u8", V.UINT8, 200),
    ("test.i8", V.INT8, -7),
    ("test.u16", V.UINT16, 65000),
    ("test.i16", V.INT16, -1234),
    ("test.u32", V.UINT32, 4_000_000_000),
    ("test.i32", V.INT32, -123456),
    ("test.f32", V.FLOAT32, 1.5),
    ("test.bool", V.BOOL, True),
    ("test.u64", V.UINT64, 2**40 + 3),
    ("test.i64", V.INT64, -(2**40)),
    ("test.f64", V.FLOAT64, 3.141592653589793),
    ("test.str", V.STRING, "héllo ✓"),
    ("test.arr_i32", V.ARRAY, (V.INT32, [1, -2, 3])),
    ("test.arr_f32", V.ARRAY, (V.FLOAT32, [0.5, -0.25])),
    ("test.arr_str", V.ARRAY, (V.STRING, ["a", "Ġb", ""])),
    ("test.arr_nested", V.ARRAY, (V.ARRAY, [(V.UINT8, [1, 2]), (V.UINT8, [])])),
    ("test.arr_empty", V.ARRAY, (V.INT32, [])),
]


@pytest.mark.parametrize("alignment", [None, 64])
def test_reader_roundtrip(tmp_path, alignment):
    f32 = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 1.0   # numpy [3, 4] -> ne = (4, 3)
    q8 = q8_0_block(0.25, np.arange(-16, 16)) + q8_0_block(-2.0, [1] * 32)
    path = tmp_path / "tiny.gguf"
    base = write_gguf(path, KVS, [("w.f32", (4, 3), Q.F32, f32.tobytes()),
                                  ("w.q8", (32, 2), Q.Q8_0, q8)], alignment)
    r = GGUFReader(path)
    assert r.version == 3
    assert r.alignment == (alignment or 32)
    assert r.data_offset == base and base % r.alignment == 0
    md = r.metadata
    assert md["general.architecture"] == "llama"
    assert md["test.u8"] == 200 and md["test.i8"] == -7
    assert md["test.u16"] == 65000 and md["test.i16"] == -1234
    assert md["test.u32"] == 4_000_000_000 and md["test.i32"] == -123456
    assert md["test.f32"] == 1.5 and md["test.bool"] is True
    assert md["test.u64"] == 2**40 + 3 and md["test.i64"] == -(2**40)
    assert md["test.f64"] == 3.141592653589793
    assert md["test.str"] == "héllo ✓"
    assert list(md["test.arr_i32"]) == [1, -2, 3]
    assert md["test.arr_i32"].dtype == np.int32
    np.testing.assert_array_equal(md["test.arr_f32"], np.array([0.5, -0.25], np.float32))
    assert md["test.arr_str"] == ["a", "Ġb", ""]
    assert md["test.arr_nested"] == [[1, 2], []]
    assert md["test.arr_empty"] == [] and r.metadata_types["test.arr_empty"] == (V.ARRAY, None)
    assert r.metadata_types["test.arr_str"] == (V.ARRAY, V.STRING)
    assert r.metadata_types["test.f64"] == V.FLOAT64

    assert list(r.tensors) == ["w.f32", "w.q8"]
    t = r.tensors["w.f32"]
    assert t.ne == (4, 3) and t.shape == (3, 4) and t.type_name == "F32"
    np.testing.assert_array_equal(r.tensor("w.f32"), f32)
    t = r.tensors["w.q8"]
    assert t.shape == (2, 32) and t.type_name == "Q8_0"
    assert t.offset % r.alignment == 0
    w = r.tensor("w.q8")
    np.testing.assert_array_equal(w[0], np.arange(-16, 16) * 0.25)
    np.testing.assert_array_equal(w[1], np.full(32, -2.0))


@pytest.mark.parametrize("content, why", [
    (b"GGML" + b"\0" * 64, "magic"),
    (b"GGUF" + struct.pack("<IQQ", 99, 0, 0), "version 99"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1), "index"),            # cut inside the header
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("k") + struct.pack("<I", 77), "77"),  # value type
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + _str("k") + struct.pack("<IQ", V.STRING, 2) + b"\xff\xfe", "utf-8"),
])
def test_reader_rejects_garbage(tmp_path, content, why):
    p = tmp_path / "bad.gguf"
    p.write_bytes(content)
    with pytest.raises(GGUFError, match=r"bad.gguf \(\d+ bytes\): not a GGUF file gguf") as e:
        GGUFReader(p)
    assert why in str(e.value).lower()


def test_reader_truncated_tensor(tmp_path):
    p = tmp_path / "trunc.gguf"
    write_gguf(p, [], [("t", (64,), Q.F32, np.zeros(64, np.float32).tobytes())])
    data = p.read_bytes()
    p.write_bytes(data[:-16])
    with pytest.raises(GGUFError, match=r"trunc.gguf \(\d+ bytes\): not a GGUF file .*reshape"):
        GGUFReader(p)


# ------------------------------------------------------------------ dequantisation
def test_dequant_q4_1_hand_computed():
    # d = 0.5, m = -1.0; elements 0..15 in the low nibbles, 16..31 in the high nibbles
    q = list(range(16)) + [15 - i for i in range(16)]
    raw = np.frombuffer(q4_1_block(0.5, -1.0, q), np.uint8)
    assert raw.size == 20
    # byte 4 (first packed byte) holds q[0]=0 (low) and q[16]=15 (high) -> 0xF0
    assert raw[4] == 0xF0 and raw[5] == 0xE1
    got = dequantize(raw, Q.Q4_1, 32)
    expected = np.array([-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0, 6.5,
                         6.5, 6.0, 5.5, 5.0, 4.5, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0],
                        np.float32)
    np.testing.assert_array_equal(got, expected)


def test_dequant_q4_1_raw_bytes_two_blocks():
    # written byte by byte: d = 1.0 (0x3C00), m = 0.25 (0x3400); all bytes 0x21 -> low 1, high 2
    b1 = bytes([0x00, 0x3C, 0x00, 0x34]) + bytes([0x21] * 16)
    # d = -0.125 (0xB000), m = 2.0 (0x4000); byte j = j -> low j&15, high 0
    b2 = bytes([0x00, 0xB0, 0x00, 0x40]) + bytes(range(16))
    got = dequantize(np.frombuffer(b1 + b2, np.uint8), Q.Q4_1, 64)
    exp1 = [1.25] * 16 + [2.25] * 16
    exp2 = [2.0 - 0.125 * j for j in range(16)] + [2.0] * 16
    np.testing.assert_array_equal(got, np.array(exp1 + exp2, np.float32))


def test_dequant_q8_0_hand_computed():
    # d = 0.5 (0x3800), qs = 0, 1, -1, 2, -2, ..., 127, -128 pattern
    qs = [0, 1, -1, 127, -128, 5, -5, 64] * 4
    raw = bytes([0x00, 0x38]) + np.array(qs, np.int8).tobytes()
    got = dequantize(np.frombuffer(raw, np.uint8), Q.Q8_0, 32)
    expected = np.array([0.0, 0.5, -0.5, 63.5, -64.0, 2.5, -2.5, 32.0] * 4, np.float32)
    np.testing.assert_array_equal(got, expected)


def test_dequant_f16_f32_bf16():
    v = np.array([1.0, -2.5, 0.0, 65504.0], np.float32)
    np.testing.assert_array_equal(dequantize(np.frombuffer(v.tobytes(), np.uint8), Q.F32, 4), v)
    np.testing.assert_array_equal(
        dequantize(np.frombuffer(v.astype(np.float16).tobytes(), np.uint8), Q.F16, 4), v)
    bf = (np.array([1.0, -2.5], np.float32).view(np.uint32) >> 16).astype("<u2")
    np.testing.assert_array_equal(dequantize(np.frombuffer(bf.tobytes(), np.uint8), Q.BF16, 2),
                                  np.array([1.0, -2.5], np.float32))


def test_dequant_q4_0_q5_0_q5_1():
    # Q4_0: d=1, q-8
    raw = np.frombuffer(np.float16(1.0).tobytes() + bytes([0x8F] * 16), np.uint8)
    np.testing.assert_array_equal(dequantize(raw, Q.Q4_0, 32), [7.0] * 16 + [0.0] * 16)
    # Q5_0: d=1, qh bit j set for even j; nibbles 0 -> q = 16*bit - 16
    qh = sum(1 << j for j in range(0, 32, 2))
    raw = np.frombuffer(np.float16(1.0).tobytes() + struct.pack("<I", qh) + bytes(16), np.uint8)
    np.testing.assert_array_equal(dequantize(raw, Q.Q5_0, 32), [0.0, -16.0] * 16)
    # Q5_1: d=0.5, m=1, all high bits set, nibbles 1 -> q=17 -> 9.5
    raw = np.frombuffer(np.float16(0.5).tobytes() + np.float16(1.0).tobytes() + struct.pack("<I", 0xFFFFFFFF)
                        + bytes([0x11] * 16), np.uint8)
    np.testing.assert_array_equal(dequantize(raw, Q.Q5_1, 32), [9.5] * 32)


def test_dequant_unsupported_type_and_bad_sizes():
    with pytest.raises(GGUFError, match="dequantisation of I32 is not implemented"):
        dequantize(np.zeros(16, np.uint8), Q.I32, 4)
    with pytest.raises(GGUFError, match="unknown ggml type type99"):
        dequantize(np.zeros(16, np.uint8), 99, 4)
    with pytest.raises(GGUFError, match="31 elements of Q8_0 is not a multiple of its block size 32"):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, 31)
    with pytest.raises(GGUFError, match="64 elements of Q8_0 need 68 bytes, got 34"):
        dequantize(np.zeros(34, np.uint8), Q.Q8_0, 64)
