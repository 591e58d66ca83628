"""The compiled kernel: a per-element function vmapped, jitted and sharded (pure jax)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from beam_jax._errors import SpecError
from beam_jax._plan import PaddedBatch

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM when allocating")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an accelerator out-of-memory error (XLA ``RESOURCE_EXHAUSTED``)."""
    text = f"{type(error).__name__}: {error}"
    return any(m in text for m in _OOM_MARKERS)


class CompileError(Exception):
    """Raised by ``Kernel.run`` when a batch shape failed to trace or compile.

    ``__cause__`` holds the original error; the failure is cached per shape.
    """


def length_mask(length: Any, size: int) -> jax.Array:
    """``bool[size]``, True on the first ``length`` positions: the mask of a ragged axis.

    Example:
        >>> length_mask(2, 4).tolist()
        [True, True, False, False]
    """
    return jax.numpy.arange(size) < length


def select_devices(devices: Sequence[jax.Device] | str | None = None) -> tuple[jax.Device, ...]:
    """The devices a worker process runs on.

    Args:
        devices: ``None`` for all local devices of the default backend, a platform name
            (``"cpu"``, ``"gpu"``, ``"tpu"``) for all local devices of that platform, or an
            explicit sequence of devices or of indices into ``jax.local_devices()`` (indices
            are what a pipeline ships to its workers: device objects cannot be pickled).
    """
    if devices is None:
        return tuple(jax.local_devices())
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


class Kernel:
    """A user function compiled once per batch shape on a process's local devices.

    The function is vmapped over the leading axis of the element leaves and the lengths,
    unless ``batched=True`` says it already takes whole batches. Each distinct batch shape is
    lowered and compiled ahead of time exactly once (so compiles can be counted and timed),
    and batches are sharded along their leading axis over all ``devices``.

    Example:
        >>> import jax.numpy as jnp
        >>> k = Kernel(lambda p, x, lengths: p * jnp.sum(x))
        >>> float(k.call(2.0, [np.ones((4, 3), np.float32)], {}, treedef=None)[0])
        6.0

    Args:
        fn: ``fn(params, element, lengths) -> outputs`` per element, where ``element`` is
            shaped like the spec (padded to the bucket) and ``lengths`` maps each ragged-axis
            name to the element's true length.
        batched: ``fn`` already takes a batch (leading axis on every leaf and length).
        devices: see ``select_devices``.
        reduce: return the sum of the outputs over the batch's real rows instead of per-row
            outputs (padded rows are masked out on the device, before the sum).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        devices: Sequence[jax.Device] | str | None = None,
        reduce: bool = False,
    ):
        self.fn = fn
        self.batched = batched
        self.reduce = reduce
        self.devices = select_devices(devices)
        self.mesh = Mesh(np.asarray(self.devices), ("batch",))
        self._shard = NamedSharding(self.mesh, PartitionSpec("batch"))
        self._replicate = NamedSharding(self.mesh, PartitionSpec())
        batched_fn = fn if batched else jax.vmap(fn, in_axes=(None, 0, 0))
        if reduce:
            batched_fn = _summing(batched_fn)
        if not batched:
            if len(self.devices) > 1:
                # Elements are independent, so each device runs its own shard of the batch
                # with no cross-device communication (and no collective to hang on if one
                # shard's computation fails).
                batched_fn = jax.shard_map(
                    batched_fn,
                    mesh=self.mesh,
                    in_specs=(PartitionSpec(), PartitionSpec("batch"), PartitionSpec("batch")),
                    out_specs=PartitionSpec("batch"),
                    check_vma=False,
                )
        self._jitted = jax.jit(batched_fn)
        self._compiled: dict[Any, Any] = {}
        self._failed: dict[Any, BaseException] = {}
        self._lock = threading.Lock()
        self.compiles = 0
        self.compile_seconds = 0.0

    def compiled_shapes(self) -> set[tuple[tuple[tuple[int, ...], str], ...]]:
        """The ``((shape, dtype), ...)`` leaf signatures compiled so far in this process."""
        return {key[1] for key in self._compiled}

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    def put_params(self, params: Any) -> Any:
        """Place ``params`` on every device (replicated); do this once per process."""
        return jax.device_put(params, self._replicate)

    def _sharding(self, size: int):
        return self._shard if size % self.num_devices == 0 else self._replicate

    def _executable(self, params, leaf_shapes, names, treedef):
        key = (treedef, tuple((tuple(s), str(np.dtype(d))) for s, d in leaf_shapes), names)
        exe = self._compiled.get(key)
        if exe is not None:
            return exe
        with self._lock:
            exe = self._compiled.get(key)
            if exe is not None:
                return exe
            if key in self._failed:
                raise CompileError(str(self._failed[key])) from self._failed[key]
            size = leaf_shapes[0][0][0]
            sharding = self._sharding(size)
            element = _unflatten(
                treedef,
                [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in leaf_shapes],
            )
            lengths = {
                n: jax.ShapeDtypeStruct(
                    (size,), np.bool_ if n == ROW_VALID else np.int32, sharding=sharding
                )
                for n in names
            }
            start = time.perf_counter()
            try:
                exe = self._jitted.lower(params, element, lengths).compile()
            except Exception as e:  # noqa: BLE001 - any trace/compile failure is per shape
                self._failed[key] = e
                raise CompileError(f"{type(e).__name__}: {e}") from e
            self.compile_seconds += time.perf_counter() - start
            self.compiles += 1
            self._compiled[key] = exe
            return exe

    def call(self, params: Any, leaves: Sequence[np.ndarray], lengths: dict, *, treedef) -> Any:
        """Run on one padded batch given as flat leaves; returns numpy outputs.

        Raises:
            CompileError: the batch's shape failed to trace or compile.
        """
        return jax.device_get(self.dispatch(params, leaves, lengths, treedef=treedef))

    def dispatch(self, params: Any, leaves: Sequence[np.ndarray], lengths: dict, *, treedef) -> Any:
        """Start ``call`` without waiting: returns the outputs as (future) device arrays.

        Fetch them with ``jax.device_get``, where errors raised while running surface. Keep
        ``leaves`` unchanged until then (on CPU they may be read in place).

        Raises:
            CompileError: the batch's shape failed to trace or compile.
        """
        names = tuple(sorted(lengths))
        exe = self._executable(params, [(x.shape, x.dtype) for x in leaves], names, treedef)
        # The executable places host arrays on its input shardings itself, about 0.2 ms per
        # batch faster than a jax.device_put per leaf from Python.
        element = _unflatten(treedef, list(leaves))
        return exe(params, element, {k: lengths[k] for k in names})

    def run(self, params: Any, batch: PaddedBatch, treedef) -> Any:
        """Run on a ``PaddedBatch``; returns the batched outputs as numpy arrays.

        With ``reduce=True``, returns the outputs summed over the real rows instead.
        """
        if not self.reduce:
            return self.call(params, batch.leaves, batch.lengths, treedef=treedef)
        lengths = {**batch.lengths, ROW_VALID: np.arange(batch.size) < batch.num_real}
        partial = self.call(params, batch.leaves, lengths, treedef=treedef)
        # One partial sum per device shard: add them up on the host.
        return jax.tree_util.tree_map(lambda x: np.sum(x, axis=0), partial)

    def precompile(self, params: Any, shapes, treedef) -> int:
        """Compile the given batch shapes now, without data; returns how many were new.

        Args:
            params: the parameters, already placed.
            shapes: iterable of ``(leaf_shapes, length_names)``, where ``leaf_shapes`` is a
                list of ``(shape, dtype)`` with the batch as the leading axis.
            treedef: the element's tree structure.
        """
        before = self.compiles
        for leaf_shapes, names in shapes:
            try:
                self._executable(params, leaf_shapes, tuple(sorted(names)), treedef)
            except CompileError:
                pass  # cached; that shape's elements are dead-lettered with the message
        return self.compiles - before


ROW_VALID = "__row_valid__"


def _summing(batched_fn):
    """Wrap a batched function so it returns its outputs summed over the valid rows.

    The sum keeps a leading axis of 1, so under ``shard_map`` each device returns its own
    partial sum (no cross-device collective) and the host adds them.
    """

    def summed(params, element, lengths):
        lengths = dict(lengths)
        valid = lengths.pop(ROW_VALID)
        out = batched_fn(params, element, lengths)

        def row_sum(o):
            keep = valid.reshape((-1,) + (1,) * (o.ndim - 1))
            return jax.numpy.sum(
                jax.numpy.where(keep, o, jax.numpy.zeros((), o.dtype)), axis=0, keepdims=True
            )

        return jax.tree_util.tree_map(row_sum, out)

    return summed


def _unflatten(treedef, leaves):
    return leaves[0] if treedef is None else treedef.unflatten(leaves)
