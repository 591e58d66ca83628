"""Files on any Beam file system: matched by a pattern, and copied to local disk for readers
that need a local path.

Beam is imported only when files are matched or copied: the layers above (the text layer
among them) run without Beam on local paths.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import shutil
import warnings
from collections.abc import Iterable

__all__ = ["copy_to_local", "dangling_links", "match_files"]


def dangling_links(pattern: str) -> list[str]:
    """The links to nothing a local ``pattern`` matches, which Beam's match leaves out: a
    job lists them so that their reading fails and names them, as any unreadable file's."""
    if "://" in pattern:
        return []
    found = glob.glob(pattern, recursive=True)
    return [p for p in found if os.path.islink(p) and not os.path.exists(p)]


def match_files(pattern: str) -> list:
    """Beam's metadata of the files ``pattern`` matches; where it matches none, those of
    the file it names as written, if any: a name such as ``data [v1].parquet`` holds glob
    characters, and as a glob does not match itself."""
    found = _match(pattern)
    if not found and glob.has_magic(pattern):
        with warnings.catch_warnings():  # Beam's regex of "[[]" warns of a nested set
            warnings.simplefilter("ignore", FutureWarning)
            found = _match(glob.escape(pattern))
    return found


def _match(pattern: str) -> list:
    from apache_beam.io.filesystem import FileMetadata
    from apache_beam.io.filesystems import FileSystems

    # Beam lists the directory before a glob's first wildcard: for a relative glob without
    # one ("*.jsonl") that is "", which it does not list; "./*.jsonl" lists the current one.
    here = "://" not in pattern and not os.path.dirname(re.split(r"[*?\[]", pattern)[0])
    here = here and glob.has_magic(pattern)
    found = FileSystems.match(["./" + pattern if here else pattern])[0].metadata_list
    if here:  # the paths as a relative path without a glob gives them
        return [FileMetadata(m.path[2:], m.size_in_bytes, m.last_updated_in_seconds) for m in found]
    return found


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
