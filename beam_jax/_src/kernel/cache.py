"""JAX's persistent compilation cache, opened only in a directory no one else can write.

JAX loads compiled programs from the cache directory and runs them: whoever can write
there can run code in the job. So a local directory must be owned by the current user and
writable by no one else (group or world); remote (``gs://``) caches are the bucket
owner's to protect, and are documented, not checked.
"""

from __future__ import annotations

import os
import stat

import jax

from beam_jax._src.errors import SpecError


def check_cache_dir(directory: str) -> None:
    """Refuse a local cache directory (or a parent it would be created in) that others can
    write.

    A directory still to be created may go in a sticky one such as ``/tmp`` (others cannot
    remove or replace what this user creates there); the cache itself may not be one.

    Raises:
        SpecError: the directory is not owned by this user, or is group/world-writable.
    """
    if "://" in directory:
        return
    path = target = os.path.abspath(directory)
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
    info = os.stat(path)
    sticky = info.st_mode & stat.S_ISVTX and info.st_uid in (0, os.getuid())
    if path != target and sticky:
        return  # created below /tmp (say) with this user's own mode, checked once created
    if info.st_uid != os.getuid():
        raise SpecError(
            f"compilation_cache_dir {directory!r}: {path} belongs to uid {info.st_uid}, not "
            f"to this user (uid {os.getuid()}); JAX runs programs from its cache, so use a "
            "directory you own."
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        fix = (
            f"use a directory of your own inside it (e.g. {os.path.join(path, 'jax_cache')})"
            if sticky
            else f"remove their write access (chmod go-w {path}) or choose another directory"
        )
        raise SpecError(
            f"compilation_cache_dir {directory!r}: {path} is writable by other users (mode "
            f"{stat.filemode(info.st_mode)}); JAX runs programs from its cache, so {fix}."
        )


def enable_compilation_cache(directory: str) -> None:
    """Turn on JAX's persistent compilation cache in ``directory`` for this process.

    Raises:
        SpecError: see ``check_cache_dir``.
    """
    check_cache_dir(directory)
    if "://" not in directory:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        check_cache_dir(directory)  # as created: not one another user made first
    if jax.config.jax_compilation_cache_dir != directory:
        # JAX opens its cache once per process; a new directory needs it reopened.
        from jax.experimental.compilation_cache import compilation_cache

        compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
