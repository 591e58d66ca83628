"""The compiled kernel: a per-element function vmapped, jitted and sharded (pure jax)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from beam_jax._src.core.plan import PaddedBatch
from beam_jax._src.errors import CompileError, SpecError
from beam_jax._src.kernel.devices import select_devices
from beam_jax._src.kernel.stored import ProgramStore

_OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "OOM when allocating")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an accelerator out-of-memory error (XLA ``RESOURCE_EXHAUSTED``)."""
    text = f"{type(error).__name__}: {error}"
    return any(m in text for m in _OOM_MARKERS)


@jax.tree_util.register_pytree_node_class
class BatchLengths(Mapping):
    """What a batched kernel receives as ``lengths``: a mapping from each ragged axis to its
    true lengths per row (``int32[batch]``), and ``valid``, False on padded rows, so a kernel
    can leave them out of anything that mixes rows (sums, means, statistics).

    Examples:
        >>> lengths = BatchLengths({"L": np.array([3, 0])}, np.array([True, False]))
        >>> lengths["L"].tolist(), lengths.valid.tolist()
        ([3, 0], [True, False])
    """

    def __init__(self, lengths: Mapping[str, Any], valid: Any):
        self._lengths = dict(lengths)
        self.valid = valid

    def __getitem__(self, name: str) -> Any:
        return self._lengths[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lengths)

    def __len__(self) -> int:
        return len(self._lengths)

    def __repr__(self) -> str:
        return f"BatchLengths({self._lengths!r}, valid={self.valid!r})"

    def tree_flatten(self):
        names = tuple(sorted(self._lengths))
        return (tuple(self._lengths[n] for n in names), self.valid), names

    @classmethod
    def tree_unflatten(cls, names, children):
        lengths, valid = children
        return cls(dict(zip(names, lengths, strict=True)), valid)


def length_mask(length: Any, size: int) -> jax.Array:
    """``bool[size]``, True on the first ``length`` positions: the mask of a ragged axis.

    Examples:
        >>> length_mask(2, 4).tolist()
        [True, True, False, False]
    """
    return jax.numpy.arange(size) < length


class Kernel:
    """A user function compiled once per batch shape on a process's local devices.

    The function is vmapped over the batch unless ``batched=True``. Each batch shape is
    compiled ahead of time exactly once (so compiles can be counted and timed), and batches
    are sharded along their leading axis over all ``devices``.

    Examples:
        >>> import jax.numpy as jnp
        >>> k = Kernel(lambda p, x, lengths: p * jnp.sum(x))
        >>> float(k.call(2.0, [np.ones((4, 3), np.float32)], {}, treedef=None)[0])
        6.0

    Args:
        fn: ``fn(params, element, lengths) -> outputs`` per element, where ``element`` is
            shaped like the spec (padded to the bucket) and ``lengths`` maps each ragged-axis
            name to the element's true length.
        batched: ``fn`` already takes a batch: a leading axis on every leaf, and
            ``lengths`` is a ``BatchLengths`` (per-axis lengths plus ``valid`` rows).
        devices: see ``select_devices``.
        chunk_rows: ``chunk_rows(row_shapes)``: the most rows ``fn`` runs at once for rows
            of these leaf shapes, or ``None`` for all; a larger batch runs as chunks inside
            one call (``in_chunks``), so activations stay cache-sized on a CPU.
        store: where each compiled shape is stored whole and loaded from without tracing
            ``fn`` (a ``ProgramStore``), or ``None``.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        batched: bool = False,
        devices: Sequence[jax.Device] | str | None = None,
        chunk_rows: Callable[[Sequence[tuple[int, ...]]], int | None] | None = None,
        store: ProgramStore | None = None,
    ):
        self.fn = fn
        self.batched = batched
        self.store = store
        self._chunk_rows = chunk_rows
        self.devices = select_devices(devices)
        self.mesh = Mesh(np.asarray(self.devices), ("batch",))
        self._shard = NamedSharding(self.mesh, PartitionSpec("batch"))
        self._replicate = NamedSharding(self.mesh, PartitionSpec())
        batched_fn = fn if batched else per_element(fn)
        if chunk_rows is not None:
            batched_fn = in_chunks(batched_fn, chunk_rows)
        # A batched fn runs whole under XLA's partitioner unless it says its shards are
        # independent (``sums_per_shard``: ReduceKernel's sums, one per shard, which the
        # host adds): a sum across devices is a collective, and a host callback raising on
        # one device leaves the others waiting in it until XLA aborts the process.
        per_shard = not batched or getattr(fn, "sums_per_shard", False)
        self._per_shard = per_shard and len(self.devices) > 1
        if self._per_shard:
            # Each device runs its own shard, with no collective to hang on.
            batched_fn = jax.shard_map(
                batched_fn,
                mesh=self.mesh,
                in_specs=(PartitionSpec(), PartitionSpec("batch"), PartitionSpec("batch")),
                out_specs=PartitionSpec("batch"),
                check_vma=False,
            )
        self._jitted = jax.jit(batched_fn)
        self._compiled: dict[Any, Any] = {}
        # The same executables keyed by what a batch's leaves give at no cost (their shapes
        # and dtypes as they are, the axis names, the treedef): a launch looks its
        # executable up without building the normalised key of ``_compiled``.
        self._by_leaves: dict[Any, Any] = {}
        self._failed: dict[Any, BaseException] = {}
        # Shapes whose program was loaded from ``store``, each with its key there. One that
        # fails at run time makes the kernel stop loading (``forget_loaded``).
        self._loaded: dict[Any, str] = {}
        self._loading = store is not None
        # Shapes being compiled now, each with the event its compile sets when done: a
        # caller of one shape waits for that shape only, while others compile in parallel.
        self._compiling: dict[Any, threading.Event] = {}
        self._lock = threading.Lock()
        # Lowering holds the interpreter lock throughout and compiling does not: shapes
        # lower one at a time and compile in parallel, so of shapes started together the
        # first is ready first instead of all of them last.
        self._lowering = threading.Lock()
        self.compiles = 0
        self.compile_seconds = 0.0
        # Of compile_seconds, the tracing and lowering (Python, holding the interpreter lock;
        # a compilation cache skips XLA's compile, not this).
        self.trace_seconds = 0.0
        self.wait_seconds = 0.0

    def count_wait(self, seconds: float) -> None:
        """Add ``seconds`` a caller spent waiting for compiles to ``wait_seconds``."""
        with self._lock:
            self.wait_seconds += seconds

    def compiled_shapes(self) -> set[tuple[tuple[tuple[int, ...], str], ...]]:
        """The ``((shape, dtype), ...)`` leaf signatures compiled so far in this process."""
        return {key[1] for key in self._compiled}

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def platform(self) -> str:
        """The platform of the kernel's devices (``"cpu"``, ``"gpu"``, ``"tpu"``, ...)."""
        return str(self.devices[0].platform)

    def put_params(self, params: Any) -> Any:
        """Place ``params`` on every device (replicated); do this once per process.

        Raises:
            SpecError: a leaf of ``params`` is not an array or a number (a str, say).
        """
        for path, leaf in jax.tree_util.tree_leaves_with_path(params):
            if not (hasattr(leaf, "__array__") or isinstance(leaf, int | float | complex)):
                raise SpecError(
                    f"load_params returned a {type(leaf).__name__} at "
                    f"params{jax.tree_util.keystr(path)}; expected arrays or numbers at every "
                    "leaf, since params go to the devices. Keep other settings out of params: "
                    "close over them in the kernel (e.g. functools.partial(fn, name=...))."
                )
        return jax.device_put(params, self._replicate)

    def _sharding(self, size: int):
        return self._shard if size % self.num_devices == 0 else self._replicate

    def is_compiled(self, leaf_shapes, names, treedef) -> bool:
        """Whether the shape ``leaf_shapes`` (``(shape, dtype)`` per leaf) is compiled."""
        return self._key(leaf_shapes, names, treedef) in self._compiled

    def compiled_for(self, leaves: Sequence[np.ndarray], names: tuple[str, ...], treedef):
        """The executable of a batch of ``leaves`` (``names``: its sorted length names),
        or ``None`` if its shape is not compiled yet: one dict look-up once it is."""
        return self._by_leaves.get((treedef, names, *[(x.shape, x.dtype) for x in leaves]))

    def _executable_for(self, params, leaves, names, treedef):
        key = (treedef, names, *[(x.shape, x.dtype) for x in leaves])
        exe = self._by_leaves.get(key)
        if exe is None:
            shapes = [(x.shape, x.dtype) for x in leaves]
            exe = self.executable(params, shapes, names, treedef)
            with self._lock:  # not a program ``forget_loaded`` dropped meanwhile
                if self._compiled.get(self._key(shapes, names, treedef)) is exe:
                    self._by_leaves[key] = exe
        return exe

    @staticmethod
    def _key(leaf_shapes, names, treedef):
        return (treedef, tuple((tuple(s), str(np.dtype(d))) for s, d in leaf_shapes), names)

    def executable(self, params, leaf_shapes, names, treedef, *, background: bool = False):
        """The executable of one batch shape, compiled now if no one has yet.

        A shape another thread is compiling is waited for, not compiled twice. Unless
        ``background``, the time this call spends compiling or waiting is added to
        ``wait_seconds``: compile time on the caller's critical path.
        """
        key = self._key(leaf_shapes, names, treedef)
        exe = self._compiled.get(key)
        if exe is not None:
            return exe
        start = time.perf_counter()
        try:
            return self._compile_or_wait(key, params, leaf_shapes, names, treedef)
        finally:
            if not background:
                self.count_wait(time.perf_counter() - start)

    def _compile_or_wait(self, key, params, leaf_shapes, names, treedef):
        while True:
            with self._lock:
                exe = self._compiled.get(key)
                if exe is not None:
                    return exe
                if key in self._failed:
                    raise self._compile_error(self._failed[key]) from self._failed[key]
                done = self._compiling.get(key)
                if done is None:
                    done = self._compiling[key] = threading.Event()
                    break
            done.wait()
        size = leaf_shapes[0][0][0]
        sharding = self._sharding(size)
        element = _unflatten(
            treedef,
            [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in leaf_shapes],
        )
        lengths = BatchLengths(
            {n: jax.ShapeDtypeStruct((size,), np.int32, sharding=sharding) for n in names},
            jax.ShapeDtypeStruct((size,), np.bool_, sharding=sharding),
        )
        start = time.perf_counter()
        error, traced = None, 0.0
        try:
            exe, stored_as = self._load(params, element, lengths, leaf_shapes)
            loaded = exe is not None
            if exe is None:
                with self._lowering:
                    lowering = time.perf_counter()
                    lowered = self._jitted.lower(params, element, lengths)
                    traced = time.perf_counter() - lowering
                # XLA releases the GIL while it compiles, so compiles in threads overlap.
                if stored_as is None:
                    exe = lowered.compile()
                else:
                    exe = self.store.compile(stored_as, lowered, self.platform)
        except Exception as e:  # noqa: BLE001 - any trace/compile failure is per shape
            error = e
        with self._lock:
            if error is None:
                self.compile_seconds += time.perf_counter() - start
                self.trace_seconds += traced
                self.compiles += 1
                self._compiled[key] = exe
                if loaded:
                    self._loaded[key] = stored_as
            else:
                self._failed[key] = error
            del self._compiling[key]
        done.set()
        if error is not None:
            raise self._compile_error(error) from error
        return exe

    def _compile_error(self, error: BaseException) -> CompileError:
        """The ``CompileError`` of a shape that failed with ``error``: its message, and a
        hint where ``fn`` runs per element (the mistake of a batched fn run under vmap)."""
        hint = ""
        if not getattr(self.fn, "batched", self.batched):  # ReduceKernel's SumRows says
            hint = (
                "\nfn runs on ONE element at a time under jax.vmap (no batch axis); if fn "
                "already takes a whole batch, pass batched=True."
            )
        return CompileError(f"{type(error).__name__}: {error}{hint}")

    def _load(self, params, element, lengths, leaf_shapes):
        """``(program, key)``: the shape's program loaded from the store (or ``None``), and
        the key to store it under once compiled (``None`` without a store)."""
        if self.store is None:
            return None, None
        rows = self._chunk_rows and self._chunk_rows([tuple(s[1:]) for s, _ in leaf_shapes])
        fn = getattr(self.fn, "fn", None)  # a library wrapper names the function it wraps
        kernel = (
            type(self.fn).__qualname__ if fn is not None else None,
            getattr(fn or self.fn, "__qualname__", type(fn or self.fn).__qualname__),
            self.batched,
            self._per_shard,
            rows,
        )
        abstract = (params, element, lengths)
        key = self.store.key(self.devices, abstract, kernel)
        if not self._loading:
            return None, key
        return self.store.load(key, self.devices, abstract), key

    def forget_loaded(
        self, leaves: Sequence[np.ndarray], names: tuple[str, ...], treedef: Any, error: Any
    ) -> bool:
        """Called when a batch of ``leaves`` failed at run time with ``error``: whether its
        program had been loaded from the store. If so, the caller runs the batch again.

        A stored program can load and still fail every run (the stored form of a program
        JAX's own cache gave on a CPU did: "NOT_FOUND: Function ... not found"). So the
        first such failure drops every program this kernel loaded, removes their files and
        loads no more: each shape compiles anew (stored again where XLA builds it, not
        where JAX's cache gives it), and no record is dead-lettered for a broken file. The
        failure is logged.
        """
        key = self._key([(x.shape, x.dtype) for x in leaves], names, treedef)
        with self._lock:
            if key not in self._loaded:
                return False
            dropped = {id(self._compiled.pop(k)) for k in self._loaded}
            self._by_leaves = {k: v for k, v in self._by_leaves.items() if id(v) not in dropped}
            files = list(self._loaded.values())
            self._loaded.clear()
            self._loading = False
        self.store.discard(files, error)
        return True

    def call(
        self,
        params: Any,
        leaves: Sequence[np.ndarray],
        lengths: dict,
        *,
        treedef: Any,
        num_real: int | None = None,
    ) -> Any:
        """Run on one padded batch given as flat leaves; returns numpy outputs.

        Args:
            params: the parameters, already placed (``put_params``).
            leaves: the padded leaves, batch first.
            lengths: per ragged axis, ``int32[batch]`` true lengths.
            treedef: the element's tree structure (``None`` for a single leaf).
            num_real: how many leading rows are real; default all.

        Raises:
            CompileError: the batch's shape failed to trace or compile.
        """
        return jax.device_get(
            self.dispatch(params, leaves, lengths, treedef=treedef, num_real=num_real)
        )

    def dispatch(
        self,
        params: Any,
        leaves: Sequence[np.ndarray],
        lengths: dict,
        *,
        treedef: Any,
        num_real: int | None = None,
    ) -> Any:
        """Start ``call`` without waiting: returns the outputs as (future) device arrays.
        Fetch them with ``jax.device_get`` (where errors surface); keep ``leaves`` unchanged
        until then (on CPU they may be read in place).

        Raises:
            CompileError: the batch's shape failed to trace or compile.
        """
        names = tuple(sorted(lengths))
        exe = self._executable_for(params, leaves, names, treedef)
        # The executable places host arrays on its input shardings itself (faster than a
        # jax.device_put per leaf from Python).
        element = _unflatten(treedef, list(leaves))
        size = len(leaves[0])
        valid = np.arange(size) < (size if num_real is None else num_real)
        return exe(params, element, BatchLengths({k: lengths[k] for k in names}, valid))

    def run(self, params: Any, batch: PaddedBatch, treedef: Any) -> Any:
        """Run on a ``PaddedBatch``; returns the batched outputs as numpy arrays."""
        return self.call(
            params, batch.leaves, batch.lengths, treedef=treedef, num_real=batch.num_real
        )

    def precompile(
        self, params: Any, shapes: Iterable[Any], treedef: Any, *, background: bool = False
    ) -> int:
        """Compile the given batch shapes now, without data; returns how many were new.

        Args:
            params: the parameters, already placed.
            shapes: iterable of ``(leaf_shapes, length_names)``, where ``leaf_shapes`` is a
                list of ``(shape, dtype)`` with the batch as the leading axis.
            treedef: the element's tree structure.
            background: the caller is not waiting for data (not counted in
                ``wait_seconds``).
        """
        before = self.compiles
        for leaf_shapes, names in shapes:
            try:
                self.executable(
                    params, leaf_shapes, tuple(sorted(names)), treedef, background=background
                )
            except CompileError:
                pass  # cached; that shape's elements are dead-lettered with the message
        return self.compiles - before


def per_element(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` vmapped over a batch; per-element functions see plain per-axis lengths."""
    vmapped = jax.vmap(fn, in_axes=(None, 0, 0))
    return lambda params, element, lengths: vmapped(params, element, dict(lengths))


# The most rows ``in_chunks`` adds to make a batch up to whole chunks, as a share of its rows.
_MOST_ROWS_ADDED = 1 / 8


def in_chunks(
    fn: Callable[..., Any], chunk_rows: Callable[[Sequence[tuple[int, ...]]], int | None]
) -> Callable[..., Any]:
    """A batched ``fn`` that runs a batch of more than ``chunk_rows(row_shapes)`` rows as
    chunks of that many inside the same call (``jax.lax.map``), outputs in row order.

    A batch the chunks do not divide is made up to whole chunks with copies of its last row
    (outputs dropped) when that adds at most an eighth to it; otherwise, or when it fits one
    chunk, it runs whole. Either way the program holds one traced copy of ``fn``.

    Examples:
        >>> import jax.numpy as jnp
        >>> double = in_chunks(lambda p, x, lengths: 2 * x, lambda shapes: 2)
        >>> double(None, jnp.arange(17), {}).tolist()[-3:]
        [28, 30, 32]
    """

    def run(params: Any, element: Any, lengths: Any) -> Any:
        leaves = jax.tree_util.tree_leaves(element)
        size = leaves[0].shape[0]
        rows = chunk_rows([tuple(x.shape[1:]) for x in leaves])
        if not rows or size <= rows:
            return fn(params, element, lengths)
        count = -(-size // rows)
        extra = count * rows - size
        if extra > _MOST_ROWS_ADDED * size:
            return fn(params, element, lengths)

        def split(x):
            if extra:  # copies of the last row make up the last chunk
                x = jnp.concatenate([x, jnp.repeat(x[-1:], extra, axis=0)])
            return x.reshape(count, rows, *x.shape[1:])

        outputs = jax.lax.map(
            lambda chunk: fn(params, *chunk), jax.tree_util.tree_map(split, (element, lengths))
        )

        def join(y):
            y = y.reshape(count * rows, *y.shape[2:])
            return y[:size] if extra else y

        return jax.tree_util.tree_map(join, outputs)

    return run


def _unflatten(treedef, leaves):
    return leaves[0] if treedef is None else treedef.unflatten(leaves)
