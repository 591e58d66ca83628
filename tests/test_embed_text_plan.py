"""Batches planned at launch from a sample of the flagship's input (pipelines/embed/plan.py)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import beam_jax as bj
from beam_jax import jobs
from beam_jax._src.jobs.runner_here import bundle_workers
from beam_jax.testing import assert_conserved
from beam_jax.text import SentenceEncoder, builtin_corpus
from pipelines.embed import job as embed_text
from pipelines.embed import plan as embed_text_plan
from pipelines.embed.flags import DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS
from pipelines.embed.parts import Inputs


def _texts(n):
    return [t for _, t in builtin_corpus(n)]


def _parquet(path, texts, start=0):
    ids = pa.array(range(start, start + len(texts)), pa.int64())
    pq.write_table(pa.table({"id": ids, "text": pa.array(texts)}), path, row_group_size=100)


def test_the_sample_spreads_over_the_files_and_counts_the_rows(tmp_path):
    texts = _texts(600)
    _parquet(tmp_path / "a.parquet", texts[:400])
    _parquet(tmp_path / "b.parquet", texts[400:] + [None] * 10, start=400)
    inputs = _inputs(str(tmp_path / "*.parquet"))
    sample, total = embed_text_plan.sample_texts(inputs, 100)
    assert total == jobs.RowCount(610, exact=True)  # from the files' footers, not the sample
    assert sample.to_pylist() == texts[:50] + texts[400:450]  # each file's first rows; no nulls

    lines = tmp_path / "c.jsonl"
    lines.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    sample, total = embed_text_plan.sample_texts(_inputs(str(lines)), 60)
    assert sample.to_pylist() == texts[:60]
    assert total.rows == pytest.approx(600, rel=0.25) and not total.exact  # from its size

    sample, total = embed_text_plan.sample_texts(_builtin(300), 5000)
    assert (len(sample), total) == (300, jobs.RowCount(300, exact=True))


def _inputs(pattern):
    return Inputs.from_args(_args("--input", pattern))


def _builtin(n):
    return Inputs.from_args(_args("--builtin_texts", str(n)))


def _args(*flags):
    args, _ = embed_text.parse_args(["--output", "unused", *flags])
    return args


def test_auto_plans_within_the_budget_and_fixed_buckets_stay():
    inputs = _builtin(500)
    flags = ("--compile_budget", "6", "--shape_cost", "0", "--batching", "buckets")
    plan = embed_text_plan.plan_for(_args(*flags), inputs)
    bounds = plan.bucketing.boundaries["L"]
    assert plan.planned and plan.sample == plan.total == 500
    assert bounds[-1] == 256 and plan.choice.shapes <= 6
    lengths = embed_text_plan.token_lengths(_texts(500))
    again = bj.plan_bucketing(
        lengths,
        max_size=256,
        compile_budget=6,
        max_batch_size=DEFAULT_BATCH_SIZE,
        max_padded_size=DEFAULT_MAX_TOKENS,
    )
    assert plan.bucketing == again.bucketing  # the sample is tokenized as the job does
    fixed = embed_text_plan.plan_for(_args("--buckets", "16,32,64,128,256"), inputs)
    assert not fixed.planned and fixed.bucketing.boundaries["L"] == (16, 32, 64, 128, 256)
    assert "planned from 500 texts" in str(plan)

    # A price per shape that no padding saving pays for: one shape per bucket, fewer buckets.
    cheap = embed_text_plan.plan_for(_args("--shape_cost", "1e12", "--batching", "buckets"), inputs)
    assert cheap.choice.shapes == len(cheap.bucketing.boundaries["L"]) == 1


def test_flags_are_checked():
    for bad in (["--compile_budget", "0"], ["--shape_cost", "-1"], ["--buckets", "x"]):
        with pytest.raises(SystemExit):
            embed_text.parse_args(["--output", "o", *bad])


def test_a_run_with_planned_buckets_pads_as_planned_and_compiles_at_start(tmp_path, capsys):
    summary = embed_text.run(
        ["--builtin_texts", "120", "--output", str(tmp_path / "out"), "--compile_budget", "3",
         "--compilation_cache_dir", "none", "--batching", "buckets"]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert "embed_text: 120 rows of the built-in corpus -> " in printed
    import jax

    plan = embed_text_plan.plan_for(_args("--builtin_texts", "120", "--compile_budget", "3",
                                          "--batching", "buckets"),
                                    _builtin(120), jax.local_device_count())  # fmt: skip
    assert_conserved(summary.totals())
    assert summary.results == 120
    # Every listed shape compiled once (at start-up), and the batches padded as planned.
    assert summary.compiles == plan.choice.shapes
    assert summary.padding_ratio == pytest.approx(plan.choice.padding_ratio)
    assert 0.0 <= summary.compile_wait_seconds
    assert "waited for" in printed
    assert np.isfinite(summary.kernel.compile_overlapped_seconds)


@pytest.mark.parametrize("budget, said", [("1", "1 length bucket,"), ("2", "2 length buckets,")])
def test_the_launch_line_counts_the_buckets(budget, said):
    flags = ("--builtin_texts", "120", "--compile_budget", budget, "--batching", "buckets")
    plan = embed_text_plan.plan_for(_args(*flags), _builtin(120), 1)
    assert plan.short().startswith(f"texts padded to {said}")


def test_auto_packs_when_the_predicted_flops_say_so_and_says_why():
    inputs = _builtin(500)
    both = embed_text_plan.plan_for(_args(), inputs)
    assert set(both.choice.flops) == {"buckets", "packed"}
    packs = both.choice.flops["packed"] < both.choice.flops["buckets"]
    assert both.batching == ("packed" if packs else "buckets")  # no shape price decides here
    assert both.reason.startswith("packing chosen" if packs else "buckets chosen")
    assert "MFLOP per real token" in str(both)
    assert both.describe()["batching"] == both.batching
    # The prediction counts attention over the padded row: longer rows cost more per token.
    encoder = SentenceEncoder.from_dir()
    assert encoder.flops_per_token(256) > encoder.flops_per_token(16)
    # A shape price no saving pays for: one shape, whichever policy wins.
    costly = embed_text_plan.plan_for(_args("--shape_cost", "1e9"), inputs)
    assert costly.choice.shapes == 1
    packed = embed_text_plan.plan_for(_args("--batching", "packed"), inputs)
    assert packed.packing is not None and packed.bucketing is None and packed.choice.shapes <= 4
    assert packed.choice.padding_ratio < 1.1 and packed.reason == "--batching packed"
    fixed = embed_text_plan.plan_for(_args("--buckets", "32,256"), inputs)
    assert fixed.batching == "buckets" and not fixed.planned


def test_a_packed_run_compiles_its_planned_shapes_and_reports_the_choice(tmp_path, capsys):
    out = tmp_path / "out"
    # Batches of 2,048 tokens: 120 texts fill several, so the padding measured is the
    # packer's, not one part-filled batch's.
    summary = embed_text.run(["--builtin_texts", "120", "--output", str(out), "--batching",
                              "packed", "--compilation_cache_dir", "none",
                              "--max_tokens_per_batch", "2048"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "texts packed in rows of" in printed  # the reason is in the record (and --verbose)
    assert_conserved(summary.totals())
    assert summary.results == 120 and summary.batching == "packed"
    assert summary.compiles <= 4 and summary.padding_ratio < 1.1
    record = json.loads((out / "_embed_text.json").read_text())
    assert record["batching"]["batching"] == "packed"
    assert "--batching packed" in record["batching"]["reason"]
    metrics = json.loads((out / "_metrics.json").read_text())
    assert metrics["summary"]["batching"] == "packed"


def test_sample_token_counts_are_the_jobs():
    texts = [*_texts(200), "", "   padded   ", "word " * 2000]  # empty, trimmed, truncated
    tokenizer = SentenceEncoder.from_dir().tokenizer()
    ids, failures = tokenizer.encode_arrow(pa.array(texts))
    assert not failures
    counts = embed_text_plan.token_lengths(texts)
    assert counts.dtype == np.int64
    assert counts.tolist() == ids.value_lengths().to_pylist()
    assert counts[-3:].tolist() == [2, 3, 256]


def test_batches_run_in_chunks_on_cpu_workers_and_whole_on_accelerators():
    from pipelines.embed.flags import DEFAULT_TOKENS_PER_CHUNK

    assert _args().tokens_per_chunk == DEFAULT_TOKENS_PER_CHUNK == 1024
    assert _args("--accelerator", "type:nvidia-l4;count:1").tokens_per_chunk == 0
    chosen = _args("--accelerator", "type:nvidia-l4;count:1", "--tokens_per_chunk", "512")
    assert chosen.tokens_per_chunk == 512
    assert _args("--tokens_per_chunk", "0").tokens_per_chunk == 0
    with pytest.raises(SystemExit):
        _args("--tokens_per_chunk", "-1")
    # Batches of the same size on every device (a CPU runs them in chunks), unless chosen.
    cpu, gpu = _args(), _args("--accelerator", "type:nvidia-l4;count:1")
    assert (cpu.batch_size, cpu.max_tokens_per_batch) == (DEFAULT_BATCH_SIZE, DEFAULT_MAX_TOKENS)
    assert (gpu.batch_size, gpu.max_tokens_per_batch) == (1024, 32768)
    chosen = _args("--accelerator", "x", "--batch_size", "64", "--max_tokens_per_batch", "4096")
    assert (chosen.batch_size, chosen.max_tokens_per_batch) == (64, 4096)
    plans = [
        embed_text_plan.plan_for(_args("--batching", "packed", *flags), _builtin(2000))
        for flags in ((), ("--accelerator", "x"), ("--max_tokens_per_batch", "8192"))
    ]
    rows = [max(max(s) for s in p.packing.packing.rows_per_batch.values()) for p in plans]
    assert rows[0] == rows[1] > rows[2], rows  # the plan takes the batches it is given
    launch = embed_text_plan.plan_for(_args("--batching", "packed"), _builtin(200))
    model = SentenceEncoder.from_dir()
    for flags, units in (((), 1024), (("--tokens_per_chunk", "0"), None)):
        step = embed_text.embed_kernel(_args(*flags), model, launch)
        assert step.options.chunk_units == units


def test_a_local_run_on_a_gpu_defaults_to_whole_batches(monkeypatch):
    """The local runners run the workers on this machine: where JAX's default device is a
    GPU or TPU, batches run whole (no chunks) without --accelerator; a remote runner's
    workers do so only with --accelerator. (The platform comes from ``local_platform``,
    which knows a TPU without opening it.)"""
    from beam_jax._src.jobs import runner_here
    from beam_jax._src.probe import LocalPlatform

    cpu = _args()
    assert not cpu.on_accelerator and cpu.tokens_per_chunk == 1024
    for backend in ("gpu", "tpu"):
        here = LocalPlatform(backend, 1, backend, opened=backend == "gpu")
        monkeypatch.setattr(runner_here, "local_platform", lambda here=here: here)
        local = _args()
        assert local.on_accelerator, backend
        assert (local.batch_size, local.max_tokens_per_batch, local.tokens_per_chunk) == (
            1024, 32768, 0
        )  # fmt: skip
        chosen = _args("--batch_size", "64", "--tokens_per_chunk", "512")
        assert (chosen.batch_size, chosen.max_tokens_per_batch, chosen.tokens_per_chunk) == (
            64, 32768, 512
        )  # fmt: skip
    remote = ["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t"]
    assert not _args(*remote).on_accelerator  # the launcher's GPU is not the workers'
    assert _args(*remote, "--accelerator", "type:nvidia-l4;count:1").on_accelerator


@pytest.mark.parametrize(
    ("flags", "here", "bundles", "one_worker"),
    [
        (["--runner=FnApiRunner"], True, 1, True),
        (["--runner=FnApiRunner", "--direct_num_workers=3"], True, 3, False),
        (["--runner=FnApiRunner", "--direct_num_workers=0"], True, "cpus", False),
        (["--runner=DirectRunner", "--direct_running_mode=multi_threading"], True, 1, True),
        (["--runner=FnApiRunner", "--direct_running_mode=multi_processing"], False, 1, False),
        (["--runner=PrismRunner"], False, 1, False),
    ],
)
def test_where_the_workers_run_and_how_many_bundles_at_once(flags, here, bundles, one_worker):
    import os

    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(flags)
    bundles = (os.cpu_count() or 1) if bundles == "cpus" else bundles  # 0: Beam's "one per CPU"

    assert jobs.workers_here(options) is here
    assert bundle_workers(options) == bundles
    assert jobs.single_worker_here(options) is one_worker
