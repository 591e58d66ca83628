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
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

import beam_jax as bj
from beam_jax import text
from beam_jax.jobs import is_local
from beam_jax.text import builtin_corpus
from pipelines.embed.parts import Inputs

__all__ = ["LaunchPlan", "in_process", "local_devices", "plan_for", "sample_texts", "token_lengths"]

# Files whose Parquet footers are read to count the job's rows; beyond this the count is
# extrapolated from their mean (each footer is one read, which on gs:// is ~50 ms).
_MAX_FOOTERS = 64


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """How a run shapes its batches: ``choice``, planned from a sample of ``sample`` texts
    for ``total`` rows, or ``fixed`` buckets (``--buckets``; ``choice`` is then None)."""

    choice: text.BatchingChoice | None
    fixed: bj.Bucketing | None = None
    sample: int = 0
    total: int = 0

    @property
    def planned(self) -> bool:
        return self.choice is not None

    @property
    def batching(self) -> str:
        """``"packed"`` or ``"buckets"``: the policy chosen."""
        return self.choice.batching if self.planned else "buckets"

    @property
    def bucketing(self) -> bj.Bucketing | None:
        return self.fixed if not self.planned or self.batching == "packed" else self.choice.policy

    @property
    def packing(self) -> bj.PackingPlan | None:
        return self.choice.policy if self.batching == "packed" else None

    @property
    def reason(self) -> str:
        return self.choice.reason if self.planned else "--buckets"

    def describe(self) -> dict:
        """For the run report: the policy, its shapes and the prediction it was chosen on."""
        if self.planned:
            return self.choice.describe()
        return {"batching": "buckets", "boundaries": list(self.fixed.boundaries["L"])}

    def __str__(self) -> str:
        if not self.planned:
            return f"embed_text: fixed buckets {','.join(map(str, self.fixed.boundaries['L']))}"
        c = self.choice
        if self.packing is not None:
            p = self.packing.packing
            sizes = "; ".join(f"{n}: {','.join(map(str, s))}" for n, s in p.rows_per_batch.items())
            lengths = ",".join(map(str, p.row_lengths))
            what = f"packed rows of {lengths} tokens (rows per batch {sizes})"
        else:
            what = f"buckets {','.join(map(str, self.bucketing.boundaries['L']))}"
        return (
            f"embed_text: {what} planned from {self.sample} texts for ~{self.total} rows: "
            f"{c.shapes} compiled shapes, expected padding {c.padding_ratio:.3f}x; {c.reason}"
        )


def sample_texts(inputs: Inputs, n: int) -> tuple[pa.Array, int]:
    """Up to ``n`` texts from the input (a ``large_string`` array), and the job's row count
    (estimated where needed).

    Every file gives a share of the sample (its first rows), so a job of many files is
    sampled across them. Rows whose text is not a string are skipped, as they are dead
    letters in the job. A file that cannot be read is skipped here; the job names it.
    """
    if inputs.format == "builtin":
        rows = builtin_corpus(inputs.builtin_texts)
        return pa.array([t for _, t in rows[:n]], pa.large_string()), len(rows)
    files = [f for f in inputs.files if f.size]
    per_file = max(1, math.ceil(n / len(files))) if files else 0
    sample = _parquet_sample if inputs.format == "parquet" else _json_lines_sample
    texts: list[pa.Array] = []
    got = rows = counted = 0
    for i, file in enumerate(files):
        want = min(per_file, n - got)
        if want <= 0 and counted >= _MAX_FOOTERS:
            break
        try:
            some, count = sample(file, want, inputs.text_column, count=i < _MAX_FOOTERS)
        except Exception:  # noqa: BLE001, S112 - the job reads it again and names the fault
            continue
        texts.append(some)
        got += len(some)
        if count is not None:
            rows, counted = rows + count, counted + 1
    total = round(rows * len(files) / counted) if counted else got
    sampled = pa.concat_arrays(texts) if texts else pa.array([], pa.large_string())
    return sampled, max(total, got)


def _parquet_sample(file, want: int, column: str, count: bool) -> tuple[pa.Array, int | None]:
    """The first ``want`` texts of a Parquet file, read a few whole row groups at a time as
    Arrow (no Python string per text), and its row count if ``count``."""
    with FileSystems.open(file.path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        parquet = pq.ParquetFile(f)
        meta = parquet.metadata
        texts: list[pa.Array] = []
        got, group = 0, 0
        if column in parquet.schema_arrow.names:
            while got < want and group < meta.num_row_groups:
                # The next row groups that hold the rows still wanted, read at once.
                first, rows = group, 0
                while rows < want - got and group < meta.num_row_groups:
                    rows, group = rows + meta.row_group(group).num_rows, group + 1
                read = parquet.read_row_groups(list(range(first, group)), columns=[column])
                some = _strings(read.column(0))
                texts.append(some)
                got += len(some)
        sampled = pa.concat_arrays(texts)[:want] if texts else pa.array([], pa.large_string())
        return sampled, meta.num_rows if count else None


def _strings(column: pa.ChunkedArray) -> pa.Array:
    """A column's non-null, valid UTF-8 strings (``large_string``); none if it holds no
    strings. The others are dead letters in the job."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return pa.array([], pa.large_string())
    values = column.combine_chunks().cast(pa.large_string()).drop_null()
    try:
        values.validate(full=True)  # the UTF-8 of every value
    except pa.ArrowInvalid:
        valid = []
        for value in values.cast(pa.large_binary()).to_pylist():
            try:
                valid.append(value.decode("utf-8"))
            except UnicodeDecodeError:
                continue
        values = pa.array(valid, pa.large_string())
    return values


def _json_lines_sample(file, want: int, column: str, count: bool) -> tuple[pa.Array, int | None]:
    texts: list[str] = []
    lines = read = 0
    with FileSystems.open(file.path) as f:  # decompressed as its extension says
        for line in iter(f.readline, b""):
            if lines >= max(want, 1):
                break
            if line.strip():
                lines, read = lines + 1, read + len(line)
                try:
                    value = json.loads(line.removeprefix(b"\xef\xbb\xbf")).get(column)
                    if isinstance(value, str):
                        value.encode()  # raises for a lone surrogate
                        texts.append(value)
                except (ValueError, AttributeError):  # the row is a dead letter in the job
                    continue
    sampled = pa.array(texts, pa.large_string())
    compressed = file.path.lower().endswith((".gz", ".bz2", ".zst", ".zstd", ".deflate", ".xz"))
    if not lines or compressed:
        return sampled, None
    # Lines in the file, from its size and the sample's bytes per line.
    return sampled, max(lines, round(file.size * lines / max(read, 1)))


def token_lengths(texts: pa.Array | Sequence[str], model: Any = None) -> np.ndarray:
    """Token counts (with ``[CLS]``/``[SEP]``, after truncation) as the job counts them:
    tokenized as its tokenize step does (``Tokenizer.encode_arrow``), with the tokenizer it
    shares when it runs in this process; the texts that fail there (dead letters in the
    job) are not counted."""
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), pa.large_string())
    tokenizer = (model or text.SentenceEncoder.from_dir()).tokenizer()
    ids, failures = tokenizer.encode_arrow(texts)
    lengths = np.diff(ids.offsets.to_numpy()).astype(np.int64)
    return np.delete(lengths, sorted(failures)) if failures else lengths


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


def plan_for(args: Any, inputs: Inputs, num_devices: int = 1, model: Any = None) -> LaunchPlan:
    """The run's batches: fixed buckets, or buckets or packed rows planned from a sample.

    Args:
        args: the parsed flags (``--buckets``, ``--batching``, ``--compile_budget``,
            ``--plan_sample``, ``--shape_cost``, ``--batch_size``, ``--max_tokens_per_batch``,
            ``--batch_sizes``, ``--rows_per_part``).
        inputs: the run's input files.
        num_devices: devices per worker where known (batch sizes are multiples of it).
        model: the ``SentenceEncoder`` (default: ``--model_dir``'s).
    """
    if args.buckets != "auto" and args.batching != "packed":
        fixed = bj.Bucketing(
            boundaries={"L": args.buckets},
            batch_size=args.batch_size,
            max_padded_size=args.max_tokens_per_batch,
            batch_sizes=args.batch_sizes,
        )
        return LaunchPlan(None, fixed)
    model = model or text.SentenceEncoder.from_dir(
        args.model_dir, manifest=args.model_manifest, matmuls=args.matmuls
    )
    texts, total = sample_texts(inputs, args.plan_sample)
    choice = text.plan_batching(
        token_lengths(texts, model),
        model,
        batching=args.batching,
        compile_budget=args.compile_budget,
        shape_cost=args.shape_cost,
        max_batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch,
        buffer_size=args.rows_per_part,
        total=max(total, 1),
        num_devices=num_devices,
    )
    return LaunchPlan(choice, sample=len(texts), total=max(total, 1))
