"""The model's GGUF file through llama.cpp's `gguf` package (gguf-py).

`gguf.GGUFReader` parses the file (v2/v3, every metadata value type, the
alignment) and memory-maps the tensor data; `gguf.quants.dequantize` turns a
tensor's blocks into float32 (F32, F16, BF16, Q4_0..Q8_0, the K-quants and
more). This module gives the numpy model what it reads: `metadata` as plain
Python values (arrays of numbers as numpy arrays, arrays of strings as lists),
`tensors` by name, `tensor(name)` dequantised, and GGUFError, with the file
named, for a file the package cannot read.

Dimensions are stored fastest-varying first: ne[0] is the length of a row. A
2-D weight with ne = [n_in, n_out] is therefore a row-major numpy array of
shape (n_out, n_in), i.e. `W @ x` maps n_in -> n_out. `Tensor.shape` gives the
numpy (row-major) shape, the reverse of ne.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType


class GGUFError(ValueError):
    pass


def type_name(ggml_type: int) -> str:
    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type{ggml_type}"


def dequantize(raw: np.ndarray, ggml_type: int, n_elements: int) -> np.ndarray:
    """Raw tensor bytes -> flat float32 array of n_elements (ggml element order)."""
    name = type_name(ggml_type)
    try:
        block, block_bytes = gguf.GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError(f"unknown ggml type {name}") from None
    if n_elements % block:
        raise GGUFError(f"{n_elements} elements of {name} is not a multiple of its block size {block}")
    nbytes = n_elements // block * block_bytes
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size < nbytes:
        raise GGUFError(f"{n_elements} elements of {name} need {nbytes} bytes, got {raw.size}")
    return _dequantize(raw[:nbytes], ggml_type).reshape(-1)


def _dequantize(data: np.ndarray, ggml_type: int) -> np.ndarray:
    try:
        out = gguf.quants.dequantize(data, GGMLQuantizationType(ggml_type))
    except NotImplementedError:
        raise GGUFError(f"dequantisation of {type_name(ggml_type)} is not implemented "
                        f"by the gguf package") from None
    # F32 comes back as a view of the file's memory map: copy it, so that no
    # weight keeps the map (and the file) open or aliases its read-only pages.
    return out.copy() if np.may_share_memory(out, data) else out


@dataclass
class Tensor:
    name: str
    ne: tuple            # dims as stored: ne[0] fastest-varying (row length)
    ggml_type: int
    offset: int          # relative to the data section
    data: np.ndarray     # gguf's memory-mapped view (blocks as uint8 rows for quantised types)

    @property
    def shape(self) -> tuple:
        """numpy (row-major) shape: reversed ne."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    def numpy(self, dtype=np.float32) -> np.ndarray:
        """Dequantised copy with numpy shape `self.shape`."""
        return _dequantize(self.data, self.ggml_type).reshape(self.shape).astype(dtype, copy=False)


def _nested_array(parts: list, i: int) -> tuple[list, int]:
    """An array of arrays from the field's raw parts at i (element type, count,
    then each element's parts), and the index after it: the package's
    ReaderField.contents() flattens nested arrays into one list."""
    etype, count = GGUFValueType(int(parts[i][0])), int(parts[i + 1][0])
    i += 2
    items = []
    for _ in range(count):
        if etype == GGUFValueType.ARRAY:
            item, i = _nested_array(parts, i)
        elif etype == GGUFValueType.STRING:
            item, i = bytes(parts[i + 1]).decode("utf-8"), i + 2
        else:
            item, i = parts[i].tolist()[0], i + 1
        items.append(item)
    return items, i


def _field_value(field: "gguf.ReaderField") -> tuple[Any, Any]:
    """(value, type) of a metadata field; type is a GGUFValueType, or for an
    array (ARRAY, element type), with element type None for an empty array."""
    kind = field.types[0]
    if kind != GGUFValueType.ARRAY:
        return field.contents(), kind
    element = field.types[1] if len(field.types) > 1 else None
    if element == GGUFValueType.ARRAY:
        # parts: key length, key, value type, then the array
        return _nested_array(field.parts, 3)[0], (kind, element)
    if element is None:
        return [], (kind, None)
    if element == GGUFValueType.STRING:
        return field.contents(), (kind, element)
    return np.concatenate([field.parts[i] for i in field.data]), (kind, element)


class GGUFReader:
    """Parses a GGUF file with the gguf package; tensor data stays memory-mapped.

    Attributes: version, metadata (dict key -> value; arrays of numbers are
    numpy arrays, arrays of strings are lists), metadata_types (key ->
    GGUFValueType, and for arrays (ARRAY, element type)), tensors (dict name ->
    Tensor, in file order), alignment, data_offset.
    """

    def __init__(self, path):
        self.path = str(path)
        try:
            r = gguf.GGUFReader(self.path)
            self.version = int(r.fields["GGUF.version"].parts[0][0])
            self.metadata: dict[str, Any] = {}
            self.metadata_types: dict[str, Any] = {}
            for key, field in r.fields.items():
                if key.startswith("GGUF."):   # the header, which the package lists as fields too
                    continue
                self.metadata[key], self.metadata_types[key] = _field_value(field)
        except (ValueError, KeyError, IndexError) as e:
            # ValueError: bad magic, version, value or tensor type, invalid
            # UTF-8, tensor data cut short (a reshape or view that falls
            # short); KeyError: a duplicate key; IndexError: a file cut inside
            # the header. The size tells a cut file from a wrong one.
            size = os.path.getsize(self.path)
            raise GGUFError(f"{self.path} ({size} bytes): not a GGUF file gguf {gguf_version()} "
                            f"can read ({type(e).__name__}: {e})") from e
        self.alignment = int(r.alignment)
        self.data_offset = int(r.data_offset)
        self.tensors: dict[str, Tensor] = {
            t.name: Tensor(t.name, tuple(int(d) for d in t.shape), int(t.tensor_type),
                           int(t.data_offset) - self.data_offset, t.data)
            for t in r.tensors}

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


def gguf_version() -> str:
    from importlib.metadata import version
    return version("gguf")
