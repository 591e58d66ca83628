"""End-to-end tests of the flagship (pipelines/embed): the real pipeline, model and files.

The texts and their sentence-transformers embeddings come from tests/fixtures/ (see
tests/test_minilm.py); each run writes a Parquet or JSON-lines file in tmp_path, calls
``embed_text.run([...])`` on the FnApiRunner and reads the output files back.
"""

from __future__ import annotations

import gc
import glob
import json
import os
import pathlib

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, StandardOptions

from beam_jax import jobs
from beam_jax._src.jobs.flags import DEFAULT_COMPILATION_CACHE
from beam_jax.testing import assert_conserved
from beam_jax.text import IdType
from pipelines.embed import job as embed_text
from tests import flagship as ft

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
MIN_COSINE = 0.9999
DIM = 384


@pytest.fixture(scope="module")
def reference():
    texts = json.loads((FIXTURES / "minilm_reference.json").read_text(encoding="utf-8"))["texts"]
    with np.load(FIXTURES / "minilm_reference.npz", allow_pickle=False) as npz:
        return texts, npz["embeddings"], npz["full_lengths"], npz["token_lengths"]


def _read_outputs(out: pathlib.Path) -> tuple[pa.Table, list[dict]]:
    files = sorted(glob.glob(str(out / "embeddings-*.parquet")))
    assert files, f"no embeddings written under {out}"
    table = pa.concat_tables(pq.read_table(f) for f in files)
    # The dead letters as FailedElement fields, with id/file/error views (tests/flagship.py).
    return table, ft.read_outputs(out)[1]


def _check_embeddings(table: pa.Table, expected: dict) -> None:
    """Every id once, each embedding 384 float32 values with cosine >= 0.9999 to its reference."""
    ids = table.column("id").to_pylist()
    assert sorted(ids, key=repr) == sorted(expected, key=repr)
    vectors = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
    assert vectors.shape == (len(ids), DIM) and vectors.dtype == np.float32
    ref = np.stack([expected[i] for i in ids]).astype(np.float64)
    cos = (vectors * ref).sum(1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(ref, axis=1))
    worst = int(np.argmin(cos))
    assert cos.min() >= MIN_COSINE, f"id {ids[worst]}: cosine {cos[worst]:.6f}"


@pytest.mark.parametrize(
    "batching, matmuls", [("buckets", "float32"), ("packed", "bfloat16")]
)  # fmt: skip
def test_parquet_int32_ids_embeddings_and_dead_letters(tmp_path, reference, batching, matmuls):
    texts, embeddings, full_lengths, token_lengths = reference
    assert (full_lengths > 256).sum() >= 20  # long texts, truncated like sentence-transformers
    ids = [1000 + 7 * i for i in range(len(texts))]
    # The fixture's "" and "   " are [CLS] [SEP] only: embedded, as sentence-transformers does.
    empty = np.flatnonzero(token_lengths <= 2)
    assert [texts[i] for i in empty] == ["", "   "]
    expected = dict(zip(ids, embeddings, strict=True))
    # Texts the tokenizer reduces to [CLS] [SEP] too (zero-width spaces are dropped).
    blank = {2: "", 3: "  \n\t  ", 4: "\u200b\u200b"}
    expected.update({k: embeddings[empty[0]] for k in blank})
    table = pa.table(
        {
            "id": pa.array([*ids, *blank, 1, None], pa.int32()),
            "text": pa.array([*texts, *blank.values(), None, "a text without an id"]),
        }
    )
    source = tmp_path / "in.parquet"
    pq.write_table(table, source, row_group_size=100)  # several row groups
    out = tmp_path / "out"
    flags = ["--batching", batching, "--matmuls", matmuls]

    summary = embed_text.run(
        ["--input", str(source), "--output", str(out), "--runner=FnApiRunner", *flags]
    )

    result, failed = _read_outputs(out)
    # Every row written has its 384 values: the embedding column is required, not nullable.
    values = pa.field("item", pa.float32(), nullable=False)
    embedding = pa.field("embedding", pa.list_(values), nullable=False)
    assert result.schema == pa.schema([("id", pa.int32()), embedding])
    _check_embeddings(result, expected)
    assert {d["id"] for d in failed} == {1, None} and len(failed) == 2
    assert {d["error_type"] for d in failed} == {"InvalidElementError"}
    assert "null text" in next(d for d in failed if d["id"] == 1)["error"]
    assert "no id" in next(d for d in failed if d["id"] is None)["error"]
    assert all(d["stage"] == "validation" and d["file"] == str(source) for d in failed)
    assert [d["row"] for d in sorted(failed, key=lambda d: d["row"])] == [
        len(texts) + 3,
        len(texts) + 4,
    ]

    assert summary.rows == len(table) and summary.results == len(expected)
    assert summary.dead_letters_by_stage["validation"] == 2
    assert summary.dead_letters_by_stage["tokenize"] == 0
    assert_conserved(summary.totals())
    assert_conserved(summary.kernel)  # nothing was lost inside the kernel step either
    assert summary.kernel.elements == len(expected)
    assert 1.0 <= summary.padding_ratio < 2.0 and summary.compiles >= 1
    assert summary.batching == batching and f"--batching {batching}" in summary.batching_reason


def test_json_lines_string_ids_and_bad_rows(tmp_path, reference):
    texts, embeddings, _, _ = reference
    chosen = list(range(0, len(texts), 20))  # a dozen texts of assorted lengths
    good = {f"doc-{i}": (texts[i], embeddings[i]) for i in chosen}
    good["ws"] = (" \t ", embeddings[texts.index("")])  # embedded as "" is
    lines = [json.dumps({"id": k, "text": t}) for k, (t, _) in good.items()]
    lines += [
        json.dumps({"id": "n42", "text": 42}),
        json.dumps({"id": "list", "text": ["not", "a", "string"]}),
        json.dumps({"id": "null", "text": None}),
        json.dumps({"id": "missing"}),
        json.dumps({"text": "a row without an id"}),
        json.dumps({"id": 5, "text": "an integer id among string ids"}),
        "this line is not JSON",
        "",  # blank lines are not rows
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"

    summary = embed_text.run(["--input", str(path), "--output", str(out), "--runner=FnApiRunner"])

    result, failed = _read_outputs(out)
    assert result.schema.field("id").type == pa.string()
    _check_embeddings(result, {k: e for k, (_, e) in good.items()})
    stages = sorted((repr(d["id"]), d["stage"]) for d in failed)
    assert stages == sorted(
        [
            ("'n42'", "read"),  # a JSON line whose fields do not fit the columns' types
            ("'list'", "read"),
            ("'null'", "validation"),
            ("'missing'", "validation"),
            ("None", "validation"),  # no id
            ("5", "read"),  # wrong id type
            ("None", "read"),  # not JSON
        ]
    )
    assert summary.rows == len(lines) - 1
    assert_conserved(summary.totals())


def test_flags_defaults_and_passthrough():
    args, options = embed_text.parse_args([])
    assert args.input is None and args.output == embed_text.DEFAULT_OUTPUT
    assert args.buckets == "auto" and args.compile_budget == 24
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    assert options.view_as(SetupOptions).save_main_session is False

    argv = [
        "--input=gs://b/in/*.parquet", "--output=gs://b/out", "--buckets", "32,128,256",
        "--batch_size", "16", "--max_tokens_per_batch", "4096",
        "--runner", "DataflowRunner", "--project", "p", "--region", "r",
        "--temp_location", "gs://b/tmp", "--setup_file", "./setup.py",
        "--sdk_container_image", "image:1",
    ]  # fmt: skip
    args, options = embed_text.parse_args(argv)
    assert (args.buckets, args.batch_size, args.max_tokens_per_batch) == ((32, 128, 256), 16, 4096)
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    gcp = options.view_as(GoogleCloudOptions)
    assert (gcp.project, gcp.region, gcp.temp_location) == ("p", "r", "gs://b/tmp")
    assert options.view_as(SetupOptions).setup_file == "./setup.py"
    assert options.get_all_options()["sdk_container_image"] == "image:1"

    with pytest.raises(SystemExit):
        embed_text.parse_args(["--buckets", "16,32,128"])  # would drop tokens 129..256


def test_input_format_and_id_types():
    assert jobs.input_format("a/*.parquet") == "parquet"
    assert jobs.input_format("gs://b/x.JSONL.gz") == "jsonl"
    with pytest.raises(ValueError, match="cannot tell the format"):
        jobs.input_format("data.csv")
    int32 = IdType(pa.int32())
    assert int32.accepts(7) and not int32.accepts(2**31) and not int32.accepts(True)
    assert not int32.accepts("7") and IdType.from_name("string").accepts("7")
    with pytest.raises(ValueError, match="integer or string"):
        IdType(pa.float64())


def test_missing_column_is_reported_before_running(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"key": [1], "text": ["x"]}), path)
    with pytest.raises(ValueError, match="no column"):
        embed_text.run(["--input", str(path), "--output", str(tmp_path / "out")])


def test_builtin_corpus_is_the_default_input(tmp_path, monkeypatch):
    frozen, freeze = [], gc.freeze
    monkeypatch.setattr(gc, "freeze", lambda: (frozen.append(True), freeze()))
    before = gc.get_freeze_count()
    out = tmp_path / "out"
    summary = embed_text.run(["--builtin_texts", "12", "--output", str(out)])  # default runner
    result, failed = _read_outputs(out)
    assert result.schema.field("id").type == pa.int64()
    assert sorted(result.column("id").to_pylist()) == list(range(12)) and not failed
    assert summary.rows == summary.results == 12 and summary.sentences_per_second > 0
    # The launch's objects were out of the collector's passes while the job ran, and are back.
    assert (len(frozen) == 1 or before) and gc.get_freeze_count() == before


def test_local_runs_keep_a_compilation_cache_and_remote_runs_do_not(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    args, _ = embed_text.parse_args([])
    assert args.compilation_cache_dir == os.path.expanduser(DEFAULT_COMPILATION_CACHE)
    args, _ = embed_text.parse_args(["--compilation_cache_dir", "none"])
    assert args.compilation_cache_dir is None
    args, _ = embed_text.parse_args(["--runner", "DataflowRunner"])
    assert args.compilation_cache_dir is None
    args, _ = embed_text.parse_args(
        ["--runner", "DataflowRunner", "--compilation_cache_dir", "gs://b/cache"]
    )
    assert args.compilation_cache_dir == "gs://b/cache"


def test_a_local_run_on_a_gpu_runs_its_batches_whole(tmp_path, monkeypatch, capsys):
    """Where JAX's default device here is a GPU, a local run (whose workers run here) runs
    its batches whole, not in the CPU's chunks, without --accelerator, says so at launch,
    and embeds as a CPU run does. (JAX itself still runs on the CPU: only the backend it
    reports is a GPU's: the platform local_platform answers, which nothing else reads.)"""

    from pipelines.embed import job

    chunks = []
    embed_kernel = job.embed_kernel

    def recorded(*args, **kwargs):
        step = embed_kernel(*args, **kwargs)
        chunks.append(step.options.chunk_units)
        return step

    monkeypatch.setattr(job, "embed_kernel", recorded)
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": list(range(1000)), "text": ft.texts(1000)}), source)
    cpu = ft.run(source, tmp_path / "cpu", "--no-progress")
    assert "batches run whole" not in capsys.readouterr().out
    from beam_jax._src.probe import LocalPlatform

    gpu_here = LocalPlatform("gpu", 1, "gpu", opened=True)
    from beam_jax._src.jobs import runner_here

    monkeypatch.setattr(jobs, "local_platform", lambda: gpu_here)
    monkeypatch.setattr(runner_here, "local_platform", lambda: gpu_here)
    gpu = ft.run(source, tmp_path / "gpu", "--no-progress", "--verbose")  # the plan's details
    assert "; batches run whole (no chunks) on this machine's gpu" in capsys.readouterr().out
    chunked = ft.run(source, tmp_path / "chunked", "--no-progress", "--tokens_per_chunk", "512",
                     "--verbose")  # fmt: skip
    assert "batches run whole" not in capsys.readouterr().out  # chunks asked for: not said
    assert chunks == [1024, None, 512]  # the CPU run's kernel in chunks of 1,024 tokens
    assert chunked.results == 1000
    assert (cpu.rows, gpu.rows, gpu.dead_letters) == (1000, 1000, 0)
    assert gpu.batches == cpu.batches == 1  # 1,000 short texts: one batch of up to 1,024
    (a, _), (b, _) = ft.read_outputs(tmp_path / "cpu"), ft.read_outputs(tmp_path / "gpu")
    assert ft.ids(a) == ft.ids(b) == list(range(1000))
    np.testing.assert_allclose(
        np.stack(a.column("embedding").to_numpy(zero_copy_only=False)),
        np.stack(b.column("embedding").to_numpy(zero_copy_only=False)),
        atol=1e-4,  # the same sums, perhaps in another order
    )


@pytest.mark.parametrize("batching", ["packed", "buckets"])
def test_any_sentence_transformers_bert_directory_is_the_model(tmp_path, batching):
    """--model_dir: a random 2-layer BERT in the sentence-transformers layout (CLS pooling,
    no Normalize, 64 wide) embeds every row as the float64 reference does."""
    from beam_jax import text
    from tests.test_text_model import reference_embed
    from tests.tiny_bert import sample_texts, write_tiny_bert

    model = write_tiny_bert(tmp_path / "model", pooling="cls", normalize=False)
    texts = sample_texts(40, seed=3)
    pq.write_table(pa.table({"id": list(range(40)), "text": texts}), tmp_path / "in.parquet")
    out = tmp_path / "out"
    # float32 matmuls: the float64 reference is met to 1e-5 (bfloat16's are ~3e-5 off).
    flags = ("--model_dir", str(model), "--batching", batching, "--matmuls", "float32")
    summary = ft.run(tmp_path / "in.parquet", out, *flags)
    assert summary.rows == 40 and summary.results == 40
    table, failed = ft.read_outputs(out)
    assert failed == []
    ids, _ = text.SentenceEncoder.from_dir(str(model)).tokenizer().encode_arrow(pa.array(texts))
    got = dict(
        zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True)
    )
    for key, tokens in enumerate(ids.to_pylist()):
        want = reference_embed(model, np.asarray(tokens))
        vector = np.asarray(got[key], np.float64)
        assert vector.shape == (64,)
        cosine = vector @ want / (np.linalg.norm(vector) * np.linalg.norm(want))
        assert cosine >= 0.99999, (key, cosine)
