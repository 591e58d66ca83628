"""Pytrees of numpy arrays to bytes and back, without pickle (for Beam state and shuffles).

An element buffered across bundles is written to runner state, and state is read back by
whichever worker owns its key next; pickle there would run arbitrary code on read. This
codec writes only data: a one-byte tag per node, then

* ``None``, ``bool``, ``int`` (any size), ``float``, ``str``, ``bytes``;
* ``tuple``, ``list`` and ``dict`` (any ``Mapping``, written in its own key order, keys
  of these same types);
* numpy arrays and scalars of every non-object dtype: the dtype string, the shape and the
  raw bytes (C order); other array-likes that expose ``__array__``, ``shape`` and
  ``dtype`` (e.g. JAX arrays) come back as numpy arrays.

Anything else raises ``TypeError`` naming the type and where it sits in the tree.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

_NONE, _TRUE, _FALSE, _INT, _FLOAT, _STR, _BYTES = b"N", b"T", b"F", b"I", b"D", b"S", b"B"
_TUPLE, _LIST, _DICT, _ARRAY, _SCALAR = b"(", b"[", b"{", b"A", b"a"
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")


def encode_tree(value: Any) -> bytes:
    """``value`` as bytes that ``decode_tree`` turns back into an equal tree.

    Example:
        >>> import numpy as np
        >>> tree = {"x": np.arange(3, dtype=np.float32), "id": ("a", 7)}
        >>> back = decode_tree(encode_tree(tree))
        >>> back["x"].tolist(), back["id"]
        ([0.0, 1.0, 2.0], ('a', 7))

    Raises:
        TypeError: a node is not one of the supported types (see the module docstring).
    """
    out: list[bytes] = []
    _encode(value, out, "<root>")
    return b"".join(out)


def decode_tree(data: bytes) -> Any:
    """The tree ``encode_tree`` wrote to ``data``.

    Raises:
        ValueError: ``data`` is truncated, has bytes left over, or holds an unknown tag.
    """
    view = memoryview(data)
    value, end = _decode(view, 0)
    if end != len(view):
        raise ValueError(f"{len(view) - end} bytes left over after the encoded tree.")
    return value


def _sized(out: list[bytes], tag: bytes, payload: bytes) -> None:
    out += [tag, _U32.pack(len(payload)), payload]


def _encode(value: Any, out: list[bytes], where: str) -> None:
    if value is None:
        out.append(_NONE)
    elif value is True or value is False:
        out.append(_TRUE if value else _FALSE)
    elif type(value) is int:
        _sized(out, _INT, str(value).encode())
    elif type(value) is float:
        out += [_FLOAT, _F64.pack(value)]
    elif isinstance(value, str):
        _sized(out, _STR, value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, bytes):
        _sized(out, _BYTES, value)
    elif isinstance(value, np.generic):
        _array(np.asarray(value), out, _SCALAR, where)
    elif isinstance(value, np.ndarray):
        _array(value, out, _ARRAY, where)
    elif isinstance(value, tuple | list):
        out += [_TUPLE if isinstance(value, tuple) else _LIST, _U32.pack(len(value))]
        for i, item in enumerate(value):
            _encode(item, out, f"{where}[{i}]")
    elif isinstance(value, Mapping):
        out += [_DICT, _U32.pack(len(value))]
        for k, v in value.items():
            _encode(k, out, f"{where} key {k!r}")
            _encode(v, out, f"{where}[{k!r}]")
    elif isinstance(value, int):  # a subclass, e.g. an IntEnum member
        _encode(int(value), out, where)
    elif isinstance(value, float):
        _encode(float(value), out, where)
    elif hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype"):
        _array(np.asarray(value), out, _ARRAY, where)
    else:
        raise TypeError(
            f"at {where}: cannot store {type(value).__name__} in Beam state; beam_jax stores "
            "None, bool, int, float, str, bytes, numpy arrays and scalars, and tuples, "
            "lists and dicts of those (convert other objects before the transform)."
        )


def _array(value: np.ndarray, out: list[bytes], tag: bytes, where: str) -> None:
    if value.dtype.hasobject:
        raise TypeError(
            f"at {where}: cannot store an array of dtype object in Beam state; convert it to "
            "a numeric, bool, string or bytes dtype."
        )
    dtype = value.dtype.str.encode()
    data = np.ascontiguousarray(value).tobytes()
    out += [tag, bytes([len(dtype)]), dtype, bytes([value.ndim])]
    out += [struct.pack(f"<{value.ndim}q", *value.shape), _U32.pack(len(data)), data]


def _need(view: memoryview, pos: int, n: int) -> None:
    if pos + n > len(view):
        raise ValueError(f"truncated encoded tree: needed {n} bytes at offset {pos}.")


def _u32(view: memoryview, pos: int) -> tuple[int, int]:
    _need(view, pos, 4)
    return _U32.unpack_from(view, pos)[0], pos + 4


def _decode(view: memoryview, pos: int) -> tuple[Any, int]:
    _need(view, pos, 1)
    tag = bytes(view[pos : pos + 1])
    pos += 1
    if tag == _NONE:
        return None, pos
    if tag in (_TRUE, _FALSE):
        return tag == _TRUE, pos
    if tag == _FLOAT:
        _need(view, pos, 8)
        return _F64.unpack_from(view, pos)[0], pos + 8
    if tag in (_INT, _STR, _BYTES):
        n, pos = _u32(view, pos)
        _need(view, pos, n)
        raw = bytes(view[pos : pos + n])
        if tag == _INT:
            return int(raw), pos + n
        return (raw.decode("utf-8", "surrogatepass") if tag == _STR else raw), pos + n
    if tag in (_TUPLE, _LIST):
        n, pos = _u32(view, pos)
        items = []
        for _ in range(n):
            item, pos = _decode(view, pos)
            items.append(item)
        return (tuple(items) if tag == _TUPLE else items), pos
    if tag == _DICT:
        n, pos = _u32(view, pos)
        result = {}
        for _ in range(n):
            k, pos = _decode(view, pos)
            result[k], pos = _decode(view, pos)
        return result, pos
    if tag in (_ARRAY, _SCALAR):
        _need(view, pos, 1)
        dtype = np.dtype(bytes(view[pos + 1 : pos + 1 + view[pos]]).decode())
        pos += 1 + view[pos]
        _need(view, pos, 1)
        ndim = view[pos]
        _need(view, pos + 1, 8 * ndim)
        shape = struct.unpack_from(f"<{ndim}q", view, pos + 1)
        n, pos = _u32(view, pos + 1 + 8 * ndim)
        _need(view, pos, n)
        array = np.frombuffer(view[pos : pos + n], dtype).reshape(shape).copy()
        return (array[()] if tag == _SCALAR else array), pos + n
    raise ValueError(f"unknown tag {tag!r} at offset {pos - 1} of the encoded tree.")
