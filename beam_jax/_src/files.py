"""Files on any Beam file system copied to local disk, for readers that need a local path.

Beam is imported only when a copy is made: the layers above (the text layer among them)
run without Beam on local paths.
"""

from __future__ import annotations

import glob
import os
import pathlib
import shutil
from collections.abc import Iterable

__all__ = ["copy_to_local", "dangling_links"]


def dangling_links(pattern: str) -> list[str]:
    """The links to nothing a local ``pattern`` matches, which Beam's match leaves out: a
    job lists them so that their reading fails and names them, as any unreadable file's."""
    if "://" in pattern:
        return []
    found = glob.glob(pattern, recursive=True)
    return [p for p in found if os.path.islink(p) and not os.path.exists(p)]


def copy_to_local(base: str, names: Iterable[str], local: pathlib.Path) -> list[str]:
    """Copies each ``base/name`` that exists (on any Beam file system) to ``local/name``,
    as stored (no decompression); returns the names copied."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    copied = []
    for name in names:
        source = FileSystems.join(base, name)
        if not FileSystems.exists(source):
            continue
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        with FileSystems.open(source, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            with open(local / name, "wb") as out:
                shutil.copyfileobj(f, out, length=1 << 24)
        copied.append(name)
    return copied
