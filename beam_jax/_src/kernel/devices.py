"""Which local devices a worker process runs on, and how a pipeline ships that choice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from beam_jax._src.errors import SpecError
from beam_jax._src.probe import check_no_tpu_left_behind, size_tpu_host_buffer


def select_devices(devices: Sequence[jax.Device] | str | None = None) -> tuple[jax.Device, ...]:
    """The devices a worker process runs on.

    Args:
        devices: ``None`` for all local devices of the default backend, a platform name
            (``"cpu"``, ``"gpu"``, ``"tpu"``) for all local devices of that platform, or an
            explicit sequence of devices or of indices into ``jax.local_devices()`` (indices
            are what a pipeline ships to its workers: device objects cannot be pickled).

    Where this opens a TPU, its host buffer is sized first (:func:`size_tpu_host_buffer`).

    Raises:
        DeviceUnavailableError: ``devices`` is ``None`` and JAX opened only the CPU where
            this process may open TPU chips (another process holds them).
    """
    size_tpu_host_buffer()
    if devices is None:
        local = tuple(jax.local_devices())
        check_no_tpu_left_behind(local)
        return local
    if isinstance(devices, str):
        try:
            return tuple(jax.local_devices(backend=devices))
        except RuntimeError as e:
            raise SpecError(
                f"no local devices for platform {devices!r}; this process has "
                f"{[d.platform for d in jax.local_devices()]}."
            ) from e
    out = tuple(devices)
    if not out:
        raise SpecError("devices must not be empty.")
    if any(_is_index(d) for d in out):
        local = jax.local_devices()
        for d in out:
            if _is_index(d) and not 0 <= d < len(local):
                raise SpecError(
                    f"device index {d} is out of range: this process has {len(local)} local "
                    f"devices {local}; pass indices below {len(local)} or devices=None for all."
                )
        out = tuple(local[d] if _is_index(d) else d for d in out)
    return out


def _is_index(d: Any) -> bool:
    return isinstance(d, int | np.integer) and not isinstance(d, bool)


def device_indices(devices: Sequence[Any]) -> tuple[int, ...]:
    """``devices`` as indices into ``jax.local_devices()``, so a pipeline can ship them.

    Raises:
        SpecError: a device is not one of this process's local devices of the default backend.
    """
    local = jax.local_devices()
    out = []
    for d in devices:
        if _is_index(d):
            out.append(int(d))
        elif d in local:
            out.append(local.index(d))
        else:
            raise SpecError(
                f"device {d!r} is not a local device of the default backend {local}; pass an "
                "index into jax.local_devices(), or a platform name such as devices='cpu'."
            )
    return tuple(out)
