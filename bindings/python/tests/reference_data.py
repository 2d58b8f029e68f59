"""The data generator of tests/reference_cycle.c, and its FNV-1a digest, for the tests."""
import numpy as np


def reference_values(stream: int, count: int) -> np.ndarray:
    """value(stream, i) of tests/reference_cycle.c for i < count, as float32:
    the same 32-bit hash, so every binding feeds the library the same bits."""
    mask = np.uint64(0xFFFFFFFF)
    i = np.arange(count, dtype=np.uint64)
    h = (i * np.uint64(2654435761) + np.uint64(stream * 97531)) & mask
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(2246822519)) & mask
    h ^= h >> np.uint64(13)
    # (h >> 8) has 24 bits: exact in float32, and so are / 2^24 and - 0.5.
    return ((h >> np.uint64(8)).astype(np.float32) / np.float32(16777216.0)
            - np.float32(0.5)).astype(np.float32)


def fnv1a(data: bytes, h: int = 0xcbf29ce484222325) -> int:
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h
