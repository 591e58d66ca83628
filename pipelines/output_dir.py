"""The output directory of a job: staged while running, published only when it succeeds.

A run writes its parts to ``OUTPUT/_unfinished/`` and moves them into ``OUTPUT`` only when
the whole job has succeeded, so a run that fails never costs the earlier output. A rerun of
the same job (same input files, sizes and times, same settings) finds the parts already
in ``_unfinished/`` and does only the rest. Every path goes through Beam's
``FileSystems``, so ``OUTPUT`` may be local or on ``gs://``.

Publishing is restartable: the list of files to move is written first
(``_unfinished/_publishing.json``), so a publish cut short is finished by the next run.

Each job says which files are its own (:class:`Layout`): the ones it publishes, and the
earlier ones a successful ``--overwrite`` run replaces; every other file in ``OUTPUT`` is
left alone. ``pipelines.embed_text`` resumes from staged parts; ``pipelines.curate``, whose
stages depend on each other, starts its staging afresh.

Example:
    >>> OutputDir("out/").staging
    'out/_unfinished'
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines.embed.write import EMBEDDINGS, FAILED, write_atomically

__all__ = ["EMBED_TEXT", "Layout", "OutputDir", "OutputExistsError"]

STAGING = "_unfinished"
JOB = "_job.json"
PUBLISHING = "_publishing.json"
RECORD = "_embed_text.json"
METRICS = "_metrics.json"  # written by pipelines.run_report after publishing
DEAD_LETTERS = "dead_letters.jsonl"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which files in a job's output directory are the job's.

    Attributes:
        published: Staged files (relative to the staging directory) that publishing moves
            into the output directory.
        ours: Files in the output directory that the job wrote; a successful run replaces
            those it did not write again, and leaves every other file alone.
        record: The file, written last, that records the published run.
        resumable: Whether a rerun of the same job keeps the staged files (and resumes from
            them); otherwise they are discarded.
    """

    published: re.Pattern
    ours: re.Pattern
    record: str
    resumable: bool


# failed/...: where dead letters were published before they moved to _failed/.
EMBED_TEXT = Layout(
    published=re.compile(rf"^({EMBEDDINGS.pattern[1:-1]}|{FAILED.pattern[1:-1]})$"),
    ours=re.compile(
        rf"^({EMBEDDINGS.pattern[1:-1]}|{FAILED.pattern[1:-1]}|failed/failed-.+\.jsonl"
        rf"|{RECORD}|{METRICS})$"
    ),
    record=RECORD,
    resumable=True,
)


class OutputExistsError(FileExistsError):
    """The output directory holds files this run would replace, or another job's parts.

    Pass ``--overwrite`` to replace the earlier output once this run has succeeded (it is
    kept until then, and files other than this job's are never touched), or choose an
    empty ``--output``.
    """


@dataclasses.dataclass(frozen=True)
class OutputDir:
    """``path``, where a job's finished output goes, and its staging directory.

    Attributes:
        path: The output directory (local or e.g. ``gs://``).
        layout: Which files are the job's; ``pipelines.embed_text``'s by default.
    """

    path: str
    layout: Layout = EMBED_TEXT

    def __post_init__(self):
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
            OutputExistsError: If ``path`` holds files and not ``overwrite``, or staging
                holds another job's parts and not ``overwrite``.
        """
        if FileSystems.exists(f"{self.staging}/{PUBLISHING}"):
            self._finish_publishing()  # an earlier run succeeded; its publish was cut short
        existing = [n for n in self._list(self.path) if not n.startswith(f"{STAGING}/")]
        if existing and not overwrite:
            shown = ", ".join(sorted(existing)[:3]) + (", ..." if len(existing) > 3 else "")
            raise OutputExistsError(
                f"--output {self.path} already holds {len(existing)} files ({shown}). Pass "
                "--overwrite to replace this job's earlier output once this run succeeds "
                "(it is kept until then), or choose an empty --output"
            )
        staged = self._list(self.staging)
        if staged:
            earlier = self._read_json(f"{self.staging}/{JOB}")
            if earlier == job and self.layout.resumable:
                return [n for n in staged if EMBEDDINGS.match(n)]
            if earlier != job and not overwrite:
                raise OutputExistsError(
                    f"{self.staging} holds the unfinished parts of another job "
                    f"({_difference(earlier, job)}); pass --overwrite to discard them, or "
                    "rerun the earlier job to finish it"
                )
            FileSystems.delete([self._tree(self.staging)])
        write_atomically(f"{self.staging}/{JOB}", json.dumps(job, indent=1).encode())
        return []

    def publish(self, record: dict[str, Any]) -> list[str]:
        """Moves the staged parts into ``path``, replacing this job's earlier files there.

        Returns:
            The published files, relative to ``path``.
        """
        new = sorted(n for n in self._list(self.staging) if self.layout.published.match(n))
        plan = {"files": new, "record": record}
        write_atomically(f"{self.staging}/{PUBLISHING}", json.dumps(plan).encode())
        return self._finish_publishing()

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
        FileSystems.delete([self._tree(self.staging)])
        return sorted(new)

    def staged_parts(self) -> list[str]:
        """The embeddings files of the parts written so far, relative to the staging directory."""
        return [n for n in self._list(self.staging) if EMBEDDINGS.match(n)]

    def collect_dead_letters(self) -> tuple[str, int]:
        """Concatenates the staged dead letters into one file; returns its path and count."""
        names = sorted(n for n in self._list(self.staging) if FAILED.match(n))
        path, count = f"{self.staging}/{DEAD_LETTERS}", 0
        temporary = f"{self.staging}/.{DEAD_LETTERS}.tmp"
        raw = CompressionTypes.UNCOMPRESSED
        with FileSystems.create(temporary, compression_type=raw) as out:
            for name in names:  # streamed: there may be more dead letters than memory
                with FileSystems.open(f"{self.staging}/{name}", compression_type=raw) as f:
                    for line in f:
                        if line.strip():
                            out.write(line if line.endswith(b"\n") else line + b"\n")
                            count += 1
        FileSystems.rename([temporary], [path])
        return path, count

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
