"""Compiled programs stored whole, so a warm worker runs its shapes without tracing them.

JAX's persistent compilation cache skips XLA's compile, not the tracing and lowering
before it: its key is the lowered program. For a large model that tracing is most of a
warm worker's start, and it holds the interpreter lock while the worker reads and
tokenizes (bench/RESULTS.md, 2026-12-07, "Programs stored whole"). A ``ProgramStore``
keeps each compiled shape as JAX's serialized executable, keyed by what decides the
program without tracing it: the caller's ``program_key`` (what the function computes),
the kernel's input structure and shapes, its devices, the versions of JAX, its backend
and beam_jax's own source, and the flags that steer XLA. A later process with the same
key loads the executable and skips the tracing too.

The key cannot see inside the function: whoever names a ``program_key`` promises that
the same key means the same function. The library's own encoders derive theirs from
their configuration; a kernel without a key is left to JAX's cache, which checks the
program.

The programs sit under the compilation cache directory, which ``check_cache_dir`` keeps
to its owner: loading a program runs it, as JAX's cache does. Only a local directory
holds them; a remote cache keeps JAX's own entries.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import pathlib
import pickle
import platform
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import jax
import jaxlib

from beam_jax._src.cores import cpuinfo_field

_LOG = logging.getLogger(__name__)

# Raised where the stored format changes: older files then miss instead of misloading.
_FORMAT = 1
SUBDIR = "beam_jax_programs"
# Environment variables that change what XLA builds from the same program.
_ENV = ("XLA_FLAGS", "LIBTPU_INIT_ARGS", "TPU_ACCELERATOR_TYPE")
# JAX settings that change tracing or XLA's build and are plain values; the cache's own
# settings and logging are left out (they do not change the program).
_CONFIG_SKIPPED = ("cache", "log", "explain", "profil", "traceback", "platforms")

_SOURCE_DIGEST: str | None = None

# JAX records this event in the compiling thread when its persistent cache returns a
# program. Such a program is stored only on a TPU: re-serialized, a CPU program loaded from
# JAX's cache has lost its compiled functions, and runs fail ("NOT_FOUND: Function
# maximum_divide_fusion not found"); a TPU's, stored this way, ran a million-text job.
# tests/test_program_store.py fails loudly if the event is renamed.
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_HITS = threading.local()
_LISTENING = threading.Lock()
_listening = False


def _count_cache_hit(event: str, **_: Any) -> None:
    if event == CACHE_HIT_EVENT:
        _HITS.count = getattr(_HITS, "count", 0) + 1


def _listen_for_cache_hits() -> None:
    global _listening
    with _LISTENING:
        if not _listening:
            jax.monitoring.register_event_listener(_count_cache_hit)
            _listening = True


def source_digest() -> str:
    """A digest of beam_jax's own Python sources, read once per process: a program built
    by one revision of the library is never loaded by another."""
    global _SOURCE_DIGEST
    if _SOURCE_DIGEST is None:
        root = pathlib.Path(__file__).resolve().parents[2]
        digest = hashlib.sha256()
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
        _SOURCE_DIGEST = digest.hexdigest()
    return _SOURCE_DIGEST


def _settings() -> list[tuple[str, str]]:
    values = getattr(jax.config, "values", {})
    return sorted(
        (name, repr(value))
        for name, value in values.items()
        if isinstance(value, bool | int | float | str | type(None))
        and not any(part in name for part in _CONFIG_SKIPPED)
    )


@functools.cache
def _host_cpu() -> str:
    """The host's CPU architecture and feature flags: XLA builds a CPU program for the
    features of the CPU it compiles on, so a cache shared between machines keeps them apart."""
    flags = cpuinfo_field("flags") or cpuinfo_field("Features")  # x86, ARM
    return f"{platform.machine()} {hashlib.sha256(flags.encode()).hexdigest()}"


def _describe(abstract: Any) -> str:
    """The shapes, dtypes and shardings of the abstract arguments, with their structure."""
    leaves, treedef = jax.tree_util.tree_flatten(abstract)
    parts = [str(treedef)]
    for leaf in leaves:
        sharding = getattr(leaf, "sharding", None)
        spec = getattr(sharding, "spec", None)
        parts.append(f"{tuple(leaf.shape)}:{leaf.dtype}:{spec}")
    return "\n".join(parts)


class ProgramStore:
    """Compiled programs of one function, stored in ``directory`` under keys that decide
    the program without tracing it.

    Example:
        >>> store = ProgramStore("/tmp/cache", "my-model-v3")  # doctest: +SKIP
        >>> key = store.key(devices, abstract_args, ("chunk rows", None))  # doctest: +SKIP

    Args:
        directory: the compilation cache directory (local, checked by the caller); the
            programs go in its ``beam_jax_programs`` folder.
        program_key: what the function computes; the same key must mean the same
            function and everything it closes over.
    """

    def __init__(self, directory: str, program_key: str):
        self.directory = pathlib.Path(directory) / SUBDIR
        self.program_key = program_key
        self.loaded = 0
        self.stored = 0
        self.skipped = 0  # compiled programs not stored (CPU programs from JAX's cache)
        self.discarded = 0  # loaded programs that failed at run time, their files removed
        self._warned = False
        self._lock = threading.Lock()  # a kernel's compile threads share the store

    @staticmethod
    def usable(directory: str | None, program_key: str | None) -> bool:
        """Whether programs can be stored: a key, and a local cache directory."""
        return bool(program_key) and bool(directory) and "://" not in str(directory)

    def key(self, devices: Sequence[jax.Device], abstract: Any, extra: Any = ()) -> str:
        """The file name of one program: a digest of everything that decides it.

        Args:
            devices: the devices it runs on, in the order of its mesh.
            abstract: its arguments as ``jax.ShapeDtypeStruct`` with shardings.
            extra: anything else of the kernel that changes the program (its wrappers).
        """
        backend = devices[0].client
        material = "\n".join(
            [
                f"format {_FORMAT}",
                f"program {self.program_key}",
                f"beam_jax {source_digest()}",
                f"jax {jax.__version__} jaxlib {jaxlib.__version__}",
                f"backend {backend.platform} {backend.platform_version}",
                f"host cpu {_host_cpu() if backend.platform == 'cpu' else '-'}",
                f"default backend {jax.default_backend()}",
                "devices " + ";".join(f"{d.id}:{d.device_kind}:{d.process_index}" for d in devices),
                "env " + repr([(name, os.environ.get(name)) for name in _ENV]),
                "config " + repr(_settings()),
                f"kernel {extra!r}",
                _describe(abstract),
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()

    def compile(self, key: str, lowered: Any, device_platform: str) -> Any:
        """``lowered`` compiled for ``device_platform``, and stored under ``key`` if XLA
        built it here (or, on a TPU, JAX loaded it from its cache: see ``CACHE_HIT_EVENT``)."""
        _listen_for_cache_hits()
        before = getattr(_HITS, "count", 0)
        program = lowered.compile()
        from_jax_cache = getattr(_HITS, "count", 0) != before
        # Once a loaded program failed (``discard``), JAX's cache is not trusted either.
        if not from_jax_cache or (device_platform == "tpu" and not self.discarded):
            self.save(key, program)
        else:
            with self._lock:
                self.skipped += 1
        return program

    def load(self, key: str, devices: Sequence[jax.Device], abstract: Any) -> Any | None:
        """The program stored under ``key``, loaded onto ``devices``; ``None`` if there is
        none, or it no longer loads (then it is logged once and its file removed)."""
        path = self.directory / f"{key}.program"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self._warn(f"could not read {path}: {e}")
            return None
        try:
            from jax.experimental import serialize_executable

            stored = pickle.loads(data)
            in_tree = jax.tree_util.tree_structure((abstract, {}))
            if stored["format"] != _FORMAT or stored["in_tree"] != in_tree:
                return None
            program = serialize_executable.deserialize_and_load(
                stored["executable"],
                stored["in_tree"],
                stored["out_tree"],
                backend=devices[0].client,
                execution_devices=list(devices),
            )
        except Exception as e:  # noqa: BLE001 - a program that no longer loads is a miss
            self._warn(f"could not load {path} ({type(e).__name__}: {e}); compiling anew")
            # Removed, so it is not read again where its shape's new program is not stored
            # (on a CPU, when JAX's cache gives it).
            path.unlink(missing_ok=True)
            return None
        with self._lock:
            self.loaded += 1
        return program

    def save(self, key: str, program: Any) -> None:
        """Store ``program`` under ``key``, whole or not at all (written aside, then
        renamed); a program that cannot be serialized is logged once and skipped."""
        try:
            from jax.experimental import serialize_executable

            executable, in_tree, out_tree = serialize_executable.serialize(program)
            data = pickle.dumps(
                {
                    "format": _FORMAT,
                    "executable": executable,
                    "in_tree": in_tree,
                    "out_tree": out_tree,
                },
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".partial")
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(data)
                os.replace(temporary, self.directory / f"{key}.program")
            except BaseException:
                os.unlink(temporary)
                raise
        except Exception as e:  # noqa: BLE001 - storing is an optimisation, never a failure
            self._warn(f"could not store a compiled program ({type(e).__name__}: {e})")
            return
        with self._lock:
            self.stored += 1

    def discard(self, keys: Sequence[str], error: Any) -> None:
        """Remove the programs stored under ``keys``: one of them loaded, then failed at
        run time with ``error``."""
        for key in keys:
            try:
                (self.directory / f"{key}.program").unlink(missing_ok=True)
            except OSError as e:
                _LOG.warning("beam_jax: could not remove a failed stored program: %s", e)
        with self._lock:
            self.discarded += len(keys)
        _LOG.warning(
            "beam_jax: a program loaded from %s failed at run time (%s: %s); the %d programs "
            "loaded from there are compiled anew, and the batch runs again",
            self.directory,
            type(error).__name__,
            str(error)[:500],
            len(keys),
        )

    def _warn(self, message: str) -> None:
        with self._lock:
            first, self._warned = not self._warned, True
        if first:
            _LOG.warning("beam_jax: %s", message)
