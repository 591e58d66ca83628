"""At launch: the run's batches, planned from a sample of its input (docs/embed_text.md).

The first texts of the input (spread over its files) are tokenized as the job will
tokenize them; ``beam_jax.text.plan_batching`` plans buckets and packed rows from their
token counts and says which it chose and why. ``--buckets 16,32,...`` fixes buckets.

Example:
    >>> plan = plan_for(args, inputs)  # doctest: +SKIP
    >>> plan.bucketing.boundaries["L"][-1]  # doctest: +SKIP
    256
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

import beam_jax as bj
from beam_jax import text
from beam_jax.internal import Plan
from beam_jax.jobs import is_local
from pipelines import corpus
from pipelines import input_files as inp
from pipelines import text_rows as tr

__all__ = [
    "LaunchPlan",
    "fixed_bucketing",
    "in_process",
    "local_devices",
    "plan_for",
    "sample_texts",
    "token_lengths",
]

# Files whose Parquet footers are read to count the job's rows; beyond this the count is
# extrapolated from their mean (each footer is one read, which on gs:// is ~50 ms).
_MAX_FOOTERS = 64


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How a run shapes its batches, and how that was chosen.

    Attributes:
        bucketing: boundaries and batch sizes, when the run buckets.
        packing: the packing plan, when the run packs (``None`` otherwise).
        planned: whether the shapes were planned from a sample (else fixed by ``--buckets``).
        sample: texts in the sample (0 when fixed).
        total: rows the plan expects the job to have.
        shapes: compiled shapes the chosen policy allows.
        padding_ratio: expected padded over real tokens (NaN when not checked on a sample).
        flops: predicted executed FLOPs per real token of each policy planned
            (``{"buckets": ..., "packed": ...}``), attention included.
        reason: why the policy was chosen, in words.
    """

    bucketing: bj.Bucketing | None
    planned: bool
    sample: int
    total: int
    shapes: int
    padding_ratio: float
    packing: bj.PackingPlan | None = None
    flops: dict = dataclasses.field(default_factory=dict)
    reason: str = ""

    @property
    def batching(self) -> str:
        """``"packed"`` or ``"buckets"``: the policy chosen."""
        return "buckets" if self.packing is None else "packed"

    def describe(self) -> dict:
        """For the run report: the policy, its shapes and the prediction it was chosen on."""
        return {
            "batching": self.batching,
            "shapes": self.shapes,
            "padding_ratio": self.padding_ratio,
            "flops_per_real_token": dict(self.flops),
            "reason": self.reason,
        }

    def __str__(self) -> str:
        if self.packing is not None:
            p = self.packing.packing
            sizes = "; ".join(f"{n}: {','.join(map(str, s))}" for n, s in p.rows_per_batch.items())
            return (
                f"embed_text: packed rows of {','.join(map(str, p.row_lengths))} tokens "
                f"(rows per batch {sizes}) planned from {self.sample} texts for ~{self.total} "
                f"rows: {self.shapes} compiled shapes, expected padding "
                f"{self.padding_ratio:.3f}x; {self.reason}"
            )
        bounds = ",".join(map(str, self.bucketing.boundaries["L"]))
        if not self.planned:
            return f"embed_text: fixed buckets {bounds} (--buckets), {self.shapes} shapes"
        return (
            f"embed_text: buckets {bounds} planned from {self.sample} texts for ~{self.total} "
            f"rows: {self.shapes} compiled shapes, expected padding {self.padding_ratio:.3f}x"
            f"{'; ' + self.reason if self.reason else ''}"
        )


def fixed_bucketing(args: Any) -> bj.Bucketing:
    """The bucketing of ``--buckets``, ``--batch_size``, ``--batch_sizes`` and the budget."""
    return bj.Bucketing(
        boundaries={"L": args.buckets},
        batch_size=args.batch_size,
        max_padded_size=args.max_tokens_per_batch,
        batch_sizes=args.batch_sizes,
    )


def sample_texts(inputs: inp.Inputs, n: int) -> tuple[list[str], int]:
    """Up to ``n`` texts from the input, and the job's row count (estimated where needed).

    Every file gives a share of the sample (its first rows), so a job of many files is
    sampled across them. Rows whose text is not a string are skipped, as they are dead
    letters in the job. A file that cannot be read is skipped here; the job names it.
    """
    if inputs.format == "builtin":
        rows = corpus.builtin_corpus(inputs.builtin_texts)
        return [t for _, t in rows[:n]], len(rows)
    files = [f for f in inputs.files if f.size]
    if not files:
        return [], 0
    per_file = max(1, math.ceil(n / len(files)))
    texts: list[str] = []
    rows = 0
    counted = 0
    for i, file in enumerate(files):
        want = min(per_file, n - len(texts)) if len(texts) < n else 0
        try:
            if inputs.format == "parquet":
                got, count = _parquet_sample(
                    file.path, want, count=i < _MAX_FOOTERS, column=inputs.text_column
                )
            else:
                got, count = _json_lines_sample(file, want, inputs.columns)
        except Exception:  # noqa: BLE001, S112 - the job reads it again and names the fault
            continue
        texts.extend(got)
        if count is not None:
            rows += count
            counted += 1
        if want == 0 and counted >= _MAX_FOOTERS:
            break
    total = round(rows * len(files) / counted) if counted else len(texts)
    return texts, max(total, len(texts))


def _parquet_sample(
    path: str, want: int, *, count: bool, column: str = "text"
) -> tuple[list[str], int | None]:
    with inp.open_file(path, CompressionTypes.UNCOMPRESSED) as f:
        parquet = pq.ParquetFile(f)
        texts: list[str] = []
        if want and column in parquet.schema_arrow.names:
            for batch in parquet.iter_batches(batch_size=min(want, 8192), columns=[column]):
                try:
                    values = batch.column(column).to_pylist()
                except UnicodeDecodeError:
                    values = []  # invalid UTF-8: those rows are dead letters in the job
                texts.extend(v for v in values if isinstance(v, str))
                if len(texts) >= want:
                    break
        return texts[:want], parquet.metadata.num_rows if count else None


def _json_lines_sample(
    file: inp.InputFile, want: int, columns: tuple[str, str] = ("id", "text")
) -> tuple[list[str], int | None]:
    texts: list[str] = []
    lines = read = 0
    with inp.open_lines(file.path) as f:
        for line in _lines(f, want):
            lines += 1
            read += len(line)
            _, text, problem = tr.parse_json_line(line.removeprefix(inp.BOM), *columns)
            if problem is None and isinstance(text, str):
                texts.append(text)
    compressed = file.path.lower().endswith((".gz", ".bz2", ".zst", ".deflate", ".xz"))
    if not lines or compressed or file.size is None:
        return texts, None
    # Lines in the file, from its size and the sample's bytes per line.
    return texts, max(lines, round(file.size * lines / max(read, 1)))


def _lines(f, want: int) -> Iterator[bytes]:
    got = 0
    for line in iter(f.readline, b""):
        if got >= max(want, 1):
            return
        if line.strip():
            got += 1
            yield line


def token_lengths(texts: list[str], model_dir: str | None = None) -> np.ndarray:
    """Token counts (with ``[CLS]``/``[SEP]``, after truncation) as the job counts them."""
    if not texts:
        return np.zeros(0, np.int64)
    tokenizer = tr.sentence_encoder(model_dir).tokenizer()
    prefixes = [tr.tokenizer_prefix(t) for t in texts]
    try:
        encoded = tokenizer.encode_batch(prefixes)
    except Exception:  # noqa: BLE001 - a text the tokenizer rejects: leave it out
        encoded = []
        for t in prefixes:
            try:
                encoded.append(tokenizer.encode(t))
            except Exception:  # noqa: BLE001, S112
                continue
    return np.asarray([len(e) for e in encoded], np.int64)


def local_devices(options: Any) -> int:
    """Devices per worker: this process's on the local runners (they run the workers
    here), else 1 (unknown at launch; batch sizes are then rounded up on the workers)."""
    if not is_local(options.view_as(StandardOptions).runner):
        return 1
    import jax

    return jax.local_device_count()


def in_process(options: Any) -> bool:
    """Whether the runner runs the pipeline in this process (FnApiRunner in its default,
    in-memory mode), so a worker built here is the one the job uses."""
    runner = options.view_as(StandardOptions).runner
    name = runner if isinstance(runner, str) else type(runner).__name__
    direct = options.view_as(DirectOptions)
    return (
        name.rsplit(".", 1)[-1] in ("FnApiRunner", "DirectRunner", "SwitchingDirectRunner")
        and (direct.direct_running_mode or "in_memory") == "in_memory"
        and (direct.direct_num_workers or 1) == 1
    )


def plan_for(args: Any, inputs: inp.Inputs, num_devices: int = 1) -> LaunchPlan:
    """The run's batches: fixed buckets, or buckets or packed rows planned from a sample.

    Args:
        args: the parsed flags (``--buckets``, ``--batching``, ``--compile_budget``,
            ``--plan_sample``, ``--shape_cost``, ``--batch_size``, ``--max_tokens_per_batch``,
            ``--rows_per_part``, ``--model_dir``).
        inputs: the run's input files.
        num_devices: devices per worker where known (batch sizes are multiples of it).
    """
    batching = getattr(args, "batching", "auto")
    if args.buckets != "auto" and batching != "packed":
        bucketing = fixed_bucketing(args)
        shapes = len(Plan(_SPEC, bucketing, num_devices=num_devices).shapes())
        return LaunchPlan(bucketing, False, 0, 0, shapes, float("nan"))
    texts, total = sample_texts(inputs, args.plan_sample)
    choice = text.plan_batching(
        token_lengths(texts, args.model_dir),
        tr.sentence_encoder(args.model_dir),
        batching=batching,
        compile_budget=args.compile_budget,
        shape_cost=args.shape_cost,
        max_batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        buffer_size=args.rows_per_part,
        total=max(total, 1),
        num_devices=num_devices,
    )
    packed = choice.batching == "packed"
    return LaunchPlan(
        None if packed else choice.policy,
        True,
        len(texts),
        max(total, 1),
        choice.shapes,
        choice.padding_ratio,
        packing=choice.policy if packed else None,
        flops=dict(choice.flops),
        reason=choice.reason,
    )


_SPEC = {"input_ids": bj.ArraySpec(("L",), np.int32)}
