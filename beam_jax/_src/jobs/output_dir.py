"""The output directory of a job: staged while running, published only when it succeeds.

A run writes to ``OUTPUT/_unfinished/`` and moves its files into ``OUTPUT`` only when the
whole job has succeeded, so a failed run never costs the earlier output. A rerun of the same
job (equal ``job`` record) resumes from the staged parts when its :class:`OutputLayout` is
resumable. Publishing writes its list of moves first (``_unfinished/_publishing.json``), so
the next run finishes a publish cut short; a rerun of the same job then has nothing left to
compute (:meth:`OutputDir.finish_publishing`). Files not the job's (:class:`OutputLayout`) are
left alone; every path goes through Beam's ``FileSystems`` (local or ``gs://``).

Example:
    >>> layout = OutputLayout(published=r"^part-\\d+\\.parquet$", record="_my_job.json")
    >>> OutputDir("out/", layout=layout).staging
    'out/_unfinished'
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import uuid
from collections.abc import Iterator
from typing import Any, BinaryIO

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_jax._src.core.wording import counted
from beam_jax._src.errors import BeamJaxError, DeadLetterThresholdError

__all__ = ["OutputLayout", "OutputDir", "OutputExistsError", "open_atomically", "write_atomically"]

STAGING = "_unfinished"
JOB = "_job.json"
PUBLISHING = "_publishing.json"
METRICS = "_metrics.json"  # staged by write_metrics, published with the parts
DEAD_LETTERS = "dead_letters.jsonl"


@contextlib.contextmanager
def open_atomically(path: str) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, whole or not at all.

    The block writes to a temporary name beside ``path`` (starting with ``.``, which
    :class:`OutputDir` never lists), renamed to ``path`` when the block ends; if the block
    raises, the temporary file is removed and ``path`` is left as it was.

    Example:
        >>> with open_atomically("note.txt") as f:
        ...     _ = f.write(b"done")
        >>> open("note.txt", "rb").read()
        b'done'
    """
    directory, name = path.rsplit("/", 1) if "/" in path else (".", path)
    temporary = f"{directory}/.{name}.{uuid.uuid4().hex}.tmp"
    try:
        with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            yield f
    except BaseException:
        with contextlib.suppress(Exception):  # the block's error is the one to see
            FileSystems.delete([temporary])
        raise
    FileSystems.rename([temporary], [path])


def write_atomically(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through :func:`open_atomically`: a reader (or a rerun)
    sees the whole file or none of it.

    Example:
        >>> write_atomically("note.txt", b"done")
        >>> open("note.txt", "rb").read()
        b'done'
    """
    with open_atomically(path) as f:
        f.write(data)


def _pattern(value: re.Pattern | str | None, name: str) -> re.Pattern | None:
    if value is None or isinstance(value, re.Pattern):
        return value
    if isinstance(value, str):
        return re.compile(value)
    raise TypeError(
        f"OutputLayout.{name} must be a regular expression (str or re.Pattern) matching "
        f"paths relative to the directory, got {type(value).__name__} {value!r}"
    )


@dataclasses.dataclass(frozen=True)
class OutputLayout:
    """Which files in a job's output directory are the job's.

    Paths are relative to the output (or staging) directory, with ``/`` between folders.

    Attributes:
        published: Staged files that publishing moves into the output directory.
        record: The file, written last by :meth:`OutputDir.publish`, that records the
            published run (its name should start with ``_`` so dataset readers skip it).
        ours: Files in the output directory that the job wrote; a successful run replaces
            those it did not write again, and leaves every other file alone. Default:
            ``published``, ``record`` and the metrics file (``_metrics.json``).
        resumable: Whether a rerun of the same job keeps the staged files (and resumes from
            them); otherwise they are discarded and the run starts afresh.
        parts: The staged files that mark finished work, which a resumed run reuses
            (returned by :meth:`OutputDir.prepare`). Default: ``published``.
        dead_letters: The staged dead-letter files (JSON lines) that
            :meth:`OutputDir.collect_dead_letters` concatenates; ``None``: none.

    Raises:
        TypeError: A pattern is neither a ``str`` nor an ``re.Pattern``.
        ValueError: ``record`` is empty or matched by ``published``.
    """

    published: re.Pattern
    record: str
    ours: re.Pattern | None = None
    resumable: bool = False
    parts: re.Pattern | None = None
    dead_letters: re.Pattern | None = None

    def __post_init__(self):
        for name in ("published", "ours", "parts", "dead_letters"):
            object.__setattr__(self, name, _pattern(getattr(self, name), name))
        if self.published is None:
            raise TypeError("OutputLayout.published is required: the staged files to publish")
        if not self.record or self.published.match(self.record):
            raise ValueError(
                f"OutputLayout.record must be a file name that published does not match, "
                f"got {self.record!r}; name it e.g. '_myjob.json'"
            )
        if self.ours is None:
            own = "|".join(re.escape(n) for n in (self.record, METRICS))
            ours = re.compile(rf"(?:{self.published.pattern})|(?:^(?:{own})$)")
            object.__setattr__(self, "ours", ours)
        if self.parts is None:
            object.__setattr__(self, "parts", self.published)


class OutputExistsError(BeamJaxError, FileExistsError):
    """The output directory holds files this run would replace, or another job's parts, or
    is a file.

    Pass ``--overwrite`` (``overwrite=True``) to replace the earlier output once this run
    has succeeded, or choose an empty ``--output``.
    """


def _as_stored(job: dict[str, Any]) -> Any:
    """``job`` as read back from its JSON file (tuples as lists), to compare with one read."""
    return json.loads(json.dumps(job))


@dataclasses.dataclass(frozen=True)
class OutputDir:
    """``path``, where a job's finished output goes, and its staging directory.

    Attributes:
        path: The output directory (local or e.g. ``gs://``).
        layout: Which files are the job's.

    Example:
        >>> import re
        >>> layout = OutputLayout(published=re.compile(r"^out\\.txt$"), record="_done.json")
        >>> output = OutputDir("result", layout=layout)
        >>> output.prepare({"input": "a.txt"}, overwrite=False)
        []
        >>> write_atomically(f"{output.staging}/out.txt", b"42")
        >>> output.publish({"rows": 1})
        ['out.txt']
    """

    path: str
    layout: OutputLayout

    def __post_init__(self):
        if not isinstance(self.layout, OutputLayout):
            raise TypeError(
                f"OutputDir.layout must be a OutputLayout, got {type(self.layout).__name__}; "
                "say which files are the job's with OutputLayout(published=..., record=...)"
            )
        object.__setattr__(self, "path", self.path.rstrip("/") or "/")

    @property
    def staging(self) -> str:
        return f"{self.path}/{STAGING}"

    def prepare(self, job: dict[str, Any], *, overwrite: bool) -> list[str]:
        """Checks the directory before a run; returns the parts already staged for ``job``.

        Args:
            job: What the run computes (inputs and settings); staged parts are reused only
                for an equal ``job``.
            overwrite: Whether the run may replace earlier output in ``path`` (once it
                succeeds) and discard another job's staged parts.

        Raises:
            OutputExistsError: If ``path`` holds files and not ``overwrite``, staging holds
                another job's parts and not ``overwrite``, or ``path`` is a local file.
        """
        if os.path.isfile(self.path):  # an object store's "directory" may share a name
            raise OutputExistsError(
                f"the output {self.path} is a file; expected a directory to write the job's "
                f"files into (created if missing). Choose another --output, e.g. "
                f"{self.path}.out/"
            )
        job = _as_stored(job)
        if FileSystems.exists(f"{self.staging}/{PUBLISHING}"):
            self._finish_publishing()  # an earlier run succeeded; its publish was cut short
        existing = [n for n in self._list(self.path) if not n.startswith(f"{STAGING}/")]
        if existing and not overwrite:
            shown = ", ".join(sorted(existing)[:3]) + (", ..." if len(existing) > 3 else "")
            raise OutputExistsError(
                f"the output directory {self.path} already holds {len(existing)} files "
                f"({shown}). Pass --overwrite (overwrite=True) to replace this job's earlier "
                "output once this run succeeds (it is kept until then), or choose an empty "
                "--output"
            )
        staged = self._list(self.staging)
        if staged:
            earlier = self._read_json(f"{self.staging}/{JOB}")
            if earlier == job and self.layout.resumable:
                return self.staged_parts()
            if earlier != job and not overwrite:
                raise OutputExistsError(
                    f"{self.staging} holds the unfinished parts of another job "
                    f"({_difference(earlier, job)}); pass --overwrite (overwrite=True) to "
                    "discard them, or rerun the earlier job to finish it"
                )
            FileSystems.delete([self._tree(self.staging)])
        write_atomically(f"{self.staging}/{JOB}", json.dumps(job, indent=1).encode())
        return []

    def publish(self, record: dict[str, Any]) -> list[str]:
        """Moves the staged parts into ``path``, replacing this job's earlier files there.

        The list of moves is written first, so the next run finishes a publish cut short
        (:meth:`finish_publishing`); ``record`` is written last, to ``layout.record``. A
        ``_metrics.json`` in the staging directory (``write_metrics(..., output.staging)``)
        is published with the parts, so a publish cut short keeps it too.

        Returns:
            The published files, relative to ``path``.
        """
        staged = self._list(self.staging)
        new = sorted(n for n in staged if self.layout.published.match(n) or n == METRICS)
        job = self._read_json(f"{self.staging}/{JOB}")
        plan = {"files": new, "record": record, "job": job}
        write_atomically(f"{self.staging}/{PUBLISHING}", json.dumps(plan).encode())
        return self._finish_publishing()

    def finish_publishing(self, job: dict[str, Any]) -> dict[str, Any] | None:
        """Finishes publishing a run of ``job`` that succeeded but was cut short while
        publishing (the process killed after :meth:`publish` began).

        Call it before :meth:`prepare`: a rerun of the same job has nothing left to compute
        once its publish is finished.

        Example:
            >>> output.finish_publishing({"input": "a.txt"}) is None  # doctest: +SKIP
            True

        Args:
            job: What the run computes, as given to :meth:`prepare`.

        Returns:
            The ``record`` that run gave :meth:`publish`, now published; ``None`` if no
            publish of ``job`` was cut short (one of another job is left to :meth:`prepare`).
        """
        plan = self._read_json(f"{self.staging}/{PUBLISHING}")
        if not isinstance(plan, dict) or plan.get("job") != _as_stored(job):
            return None
        self._finish_publishing()
        return plan["record"]

    def _finish_publishing(self) -> list[str]:
        plan = self._read_json(f"{self.staging}/{PUBLISHING}")
        new = set(plan["files"])
        record = f"{self.path}/{self.layout.record}"
        if FileSystems.exists(record):
            FileSystems.delete([record])  # no record: the directory is between two outputs
        staged = set(self._list(self.staging)) & new
        moves = sorted(staged)
        # A local rename needs the directories; a bucket has none.
        for folder in sorted({n.rsplit("/", 1)[0] for n in moves if "/" in n}):
            if not FileSystems.exists(f"{self.path}/{folder}"):
                FileSystems.mkdirs(f"{self.path}/{folder}")
        if moves:
            FileSystems.rename(
                [f"{self.staging}/{n}" for n in moves], [f"{self.path}/{n}" for n in moves]
            )
        old = [
            n
            for n in self._list(self.path)
            if not n.startswith(f"{STAGING}/") and self.layout.ours.match(n) and n not in new
        ]
        if old:
            FileSystems.delete([f"{self.path}/{n}" for n in old])
        write_atomically(record, json.dumps(plan["record"], indent=1).encode())
        # The list of moves goes last: while any staged file is left, a rerun finishes this.
        rest = [f"{self.staging}/{n}" for n in self._list(self.staging) if n != PUBLISHING]
        if rest:
            FileSystems.delete(rest)
        FileSystems.delete([self._tree(self.staging)])
        return sorted(new)

    def staged_parts(self) -> list[str]:
        """The staged files matching ``layout.parts``, relative to the staging directory."""
        return [n for n in self._list(self.staging) if self.layout.parts.match(n)]

    def collect_dead_letters(self) -> tuple[str, int]:
        """Concatenates the staged dead letters into one file; returns its path and count.

        The files are those matching ``layout.dead_letters``, in name order; the result is
        ``_unfinished/dead_letters.jsonl``, one JSON line per dead letter.
        """
        pattern = self.layout.dead_letters
        names = sorted(n for n in self._list(self.staging) if pattern and pattern.match(n))
        path, count = f"{self.staging}/{DEAD_LETTERS}", 0
        raw = CompressionTypes.UNCOMPRESSED
        with open_atomically(path) as out:
            for name in names:  # streamed: there may be more dead letters than memory
                with FileSystems.open(f"{self.staging}/{name}", compression_type=raw) as f:
                    for line in f:
                        if line.strip():
                            out.write(line if line.endswith(b"\n") else line + b"\n")
                            count += 1
        return path, count

    def check_threshold(self, failed: dict[str, tuple[int, int]], threshold: float) -> None:
        """Fails the run, before publishing, if more than ``threshold`` of anything failed.

        Example:
            >>> output.check_threshold({"rows": (3, 1000), "files": (0, 4)}, 0.01)  # doctest: +SKIP

        Args:
            failed: ``{what: (failed, total)}``, e.g. rows and files.
            threshold: The largest tolerated ratio (a job's ``--threshold``).

        Raises:
            beam_jax.DeadLetterThresholdError: Naming what failed and the file that holds
                the staged dead letters (:meth:`collect_dead_letters`).
        """
        over = [
            f"{bad} of {total} {what} failed ({bad / total:.2%})"
            for what, (bad, total) in failed.items()
            if total and bad / total > threshold
        ]
        if not over:
            return
        path, count = self.collect_dead_letters()
        kept = f" to publish the parts already written in {self.staging} without recomputing them"
        raise DeadLetterThresholdError(
            f"{' and '.join(over)}, more than --threshold {threshold:g}. Nothing was published: "
            f"the earlier files in {self.path} (if any) are untouched. The "
            f"{counted(count, 'dead letter')} {'is' if count == 1 else 'are'} in {path}. Fix "
            "the data and rerun with --overwrite, or rerun with a "
            f"higher --threshold{kept if self.layout.resumable else ''}"
        )

    def explain_failure(self, error: BaseException, job: str, reused: int = 0) -> None:
        """Adds a note to the run's ``error``: nothing was published, and where the staged
        parts (``reused`` of them from earlier runs) and their dead letters are."""
        try:
            path, count = self.collect_dead_letters()
            parts = len(self.staged_parts()) if self.layout.parts else 0
        except Exception:  # noqa: BLE001 - the job's own error matters more than this note
            return
        resume = (
            ", and rerunning the same command resumes from them" if self.layout.resumable else ""
        )
        error.add_note(
            f"{job}: the job failed, so nothing was published; the earlier files in "
            f"{self.path} (if any) are untouched. {parts} parts are kept in {self.staging} "
            f"({reused} from earlier runs){resume}. Their {count} dead letters so far are "
            f"in {path}."
        )

    def _list(self, directory: str) -> list[str]:
        """Every file under ``directory``, relative to it; temporary files left out."""
        prefix = f"{directory}/"
        found = FileSystems.match([f"{prefix}**"])[0].metadata_list
        names = [m.path[len(prefix) :] for m in found if m.path.startswith(prefix)]
        return [n for n in names if not n.rsplit("/", 1)[-1].startswith(".")]

    def _read_json(self, path: str) -> Any:
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
                return json.loads(f.read())
        except Exception:  # noqa: BLE001 - missing or torn: nothing can be reused
            return None

    @staticmethod
    def _tree(directory: str) -> str:
        # Beam deletes a local directory by its path, a bucket "directory" by its prefix.
        return f"{directory}/" if "://" in directory else directory


def _difference(earlier: dict | None, job: dict) -> str:
    if not isinstance(earlier, dict):
        return "its job record is missing or unreadable"
    keys = sorted(set(earlier) | set(job))
    changed = [k for k in keys if earlier.get(k) != job.get(k)]
    if changed == ["inputs"]:
        return "the input files or their sizes or modification times differ"
    return "different " + ", ".join(changed)
