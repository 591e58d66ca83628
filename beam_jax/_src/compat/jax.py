"""The private names of JAX that beam_jax uses, all here (see ``compat/__init__.py``)."""

from __future__ import annotations


def backends_opened() -> bool | None:
    """Whether this process's JAX backends are open: ``None`` while they are being opened
    (a TPU's opening takes seconds), answered without waiting for it.

    JAX holds ``xla_bridge._backend_lock`` while it opens its backends, and every public
    reading (``jax.devices()``, ``backends_are_initialized()``) waits for that lock.
    Public API to move to: a non-blocking query of the open backends (JAX 0.10's
    ``jax.extend.backend`` has none).
    """
    from jax._src import xla_bridge

    lock = getattr(xla_bridge, "_backend_lock", None)
    if lock is None:  # moved (tests/test_compat.py says so): the reading that may wait
        return bool(xla_bridge.backends_are_initialized())
    if not lock.acquire(blocking=False):
        return None
    try:
        return bool(xla_bridge._backends)
    finally:
        lock.release()
