"""The safetensors format, read and written with JAX's float types (bfloat16, float8).

``safetensors.numpy`` refuses them (``KeyError: 'BF16'``), though checkpoints saved in
bfloat16 are common. The format is an 8-byte little-endian header length, a JSON header
naming each tensor's dtype, shape and byte range, then the bytes; the tests check these
functions against ``safetensors.numpy`` for every dtype it supports.

Example:
    >>> import ml_dtypes
    >>> read_safetensors(write_safetensors({"w": np.ones(2, ml_dtypes.bfloat16)}))["w"]
    array([1, 1], dtype=bfloat16)
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import ml_dtypes
import numpy as np

_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "U16": np.uint16,
    "I16": np.int16,
    "U32": np.uint32,
    "I32": np.int32,
    "U64": np.uint64,
    "I64": np.int64,
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
}
_NAMES = {np.dtype(t): name for name, t in _DTYPES.items()}


def read_safetensors(data: bytes | bytearray) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file's bytes, as arrays over ``data`` (read-only over
    ``bytes``, writable over a ``bytearray``).

    Raises:
        ValueError: ``data`` is not a safetensors file, or holds a dtype not listed here.
    """
    try:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        header.pop("__metadata__", None)
        tensors = {}
        for name, info in header.items():
            dtype = np.dtype(_DTYPES[info["dtype"]])
            begin, end = info["data_offsets"]
            count = (end - begin) // dtype.itemsize
            flat = np.frombuffer(data, dtype, count=count, offset=8 + size + begin)
            tensors[name] = flat.reshape(info["shape"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"not a safetensors file of the dtypes {sorted(_DTYPES)} ({type(e).__name__}: {e})"
        ) from e
    return tensors


def write_safetensors(tensors: Mapping[str, np.ndarray]) -> bytes:
    """The bytes of a safetensors file holding ``tensors`` (C-ordered, any listed dtype).

    Raises:
        ValueError: a tensor's dtype is not one the format has.
    """
    header, chunks, at = {}, [], 0
    for name, array in tensors.items():
        if array.dtype not in _NAMES:
            raise ValueError(
                f"tensor {name!r} has dtype {array.dtype}; safetensors holds "
                f"{', '.join(str(np.dtype(t)) for t in _DTYPES.values())}"
            )
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [at, at + len(raw)],
        }
        chunks.append(raw)
        at += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the bytes start 8-aligned, as safetensors writes them
    return len(text).to_bytes(8, "little") + text + b"".join(chunks)
