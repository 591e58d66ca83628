"""Loading parameters from formats that cannot run code: safetensors and pickle-free .npz."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from beam_jax._src.core.dtypes import kind
from beam_jax._src.core.tensor_file import read_safetensors, write_safetensors
from beam_jax._src.errors import SpecError

_SAFE_SUFFIXES = (".safetensors", ".npz")


def _read_bytes(path: str) -> bytes:
    if "://" in path:
        # Remote paths (gs://, s3://, hdfs://) go through Beam's filesystems, as on Dataflow.
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path) as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _nest(flat: Mapping[str, np.ndarray], sep: str | None) -> dict[str, Any]:
    if sep is None:
        return dict(flat)
    out: dict[str, Any] = {}
    for name, value in flat.items():
        parts = name.split(sep)
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError(f"parameter {name!r} clashes with parameter {part!r}.")
            node = child
        if parts[-1] in node:
            raise SpecError(f"parameter {name!r} clashes with a group of the same name.")
        node[parts[-1]] = value
    return out


def _flatten(tree: Mapping[str, Any], sep: str, prefix: str = "") -> dict[str, np.ndarray]:
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(_flatten(value, sep, name))
        else:
            # np.require keeps 0-d arrays 0-d (np.ascontiguousarray makes them 1-d).
            array = np.require(np.asarray(value), requirements="C")
            if kind(array.dtype) in "OV":
                raise SpecError(
                    f"parameter {name!r} has dtype {array.dtype}; only numeric, bool and string "
                    "arrays can be saved without pickling."
                )
            flat[name] = array
    return flat


def read_params(path: str, *, sep: str | None = ".") -> dict[str, Any]:
    """Load parameters from a ``.safetensors`` or ``.npz`` file, local or remote.

    Neither format can execute code on load (``.npz`` is read with ``allow_pickle=False``),
    so a parameter file from an untrusted bucket cannot take over a worker.

    Examples:
        >>> write_params({"dense": {"w": np.ones((2, 2), np.float32)}}, "/tmp/p.safetensors")
        >>> read_params("/tmp/p.safetensors")["dense"]["w"].shape
        (2, 2)

    Args:
        path: a local path or a URI Beam's filesystems can open (``gs://...``).
        sep: names are split on ``sep`` into nested dicts; ``None`` keeps them flat.

    Returns:
        A (nested) dict of numpy arrays.

    Raises:
        SpecError: the file is neither ``.safetensors`` nor ``.npz``, or holds pickled objects.
    """
    if path.endswith(".safetensors"):
        try:
            flat = read_safetensors(bytearray(_read_bytes(path)))  # writable, as from .npz
        except ValueError as e:
            raise SpecError(f"cannot read parameters from {path}: {e}") from e
    elif path.endswith(".npz"):
        try:
            with np.load(io.BytesIO(_read_bytes(path)), allow_pickle=False) as data:
                flat = {k: data[k] for k in data.files}
        except ValueError as e:
            raise SpecError(
                f"{path} holds pickled objects, which beam_jax refuses to load; re-save it "
                "with plain numeric arrays (write_params) or as .safetensors."
            ) from e
    else:
        raise SpecError(
            f"cannot load parameters from {path!r}: expected one of {_SAFE_SUFFIXES}. Pickle "
            "and other formats that can run code are not supported; convert with write_params."
        )
    return _nest(flat, sep)


def write_params(params: Mapping[str, Any], path: str, *, sep: str = ".") -> None:
    """Write a (nested) dict of arrays as ``.safetensors`` or ``.npz`` (never a pickle); a
    local path's missing directories are created."""
    flat = _flatten(params, sep)
    if path.endswith(".safetensors"):
        try:
            data = write_safetensors(flat)
        except ValueError as e:
            raise SpecError(f"cannot save parameters to {path}: {e}") from e
    elif path.endswith(".npz"):
        extra = sorted(n for n, a in flat.items() if a.dtype.kind == "V")
        if extra:  # .npz would store them as raw bytes, their dtype lost
            raise SpecError(
                f"parameters {extra} are of JAX's float types, which .npz cannot keep; save "
                "them as .safetensors."
            )
        buf = io.BytesIO()
        np.savez(buf, **flat)
        data = buf.getvalue()
    else:
        raise SpecError(f"cannot save parameters to {path!r}: expected one of {_SAFE_SUFFIXES}.")
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.create(path) as f:
            f.write(data)
    else:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
