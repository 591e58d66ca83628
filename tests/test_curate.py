"""Tests of pipelines/curate/: the kernels, the full-batch gradient, and seeded runs.

The end-to-end run is the default job (the built-in labelled corpus, 10% of the labels
flipped, 14 full-batch passes) on the FnApiRunner; its files are then reused to check that
the pipeline's full-batch gradient is the gradient of the same loss over the unpadded data,
whatever the buckets, batch sizes and number of workers.
"""

from __future__ import annotations

import glob
import json
import pathlib
import shutil
import subprocess
import sys

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

import beam_jax as bj
from beam_jax import jobs
from beam_jax._src.cli.report import load_metrics
from beam_jax.text import labelled_corpus
from pipelines import curate
from pipelines.curate import job as curate_job
from pipelines.curate import model as cm
from pipelines.curate import passes as cp
from pipelines.curate import read as cr
from pipelines.curate import report
from tests import kill_while_publishing, processes

ROOT = pathlib.Path(__file__).resolve().parents[1]

MAX_RELATIVE_ERROR = 1e-5


# ---------------------------------------------------------------- references


def _hash_np(tokens: np.ndarray, rows: int) -> np.ndarray:
    bits = rows.bit_length() - 1
    return ((tokens.astype(np.uint64) * 2654435761) % 2**32 >> (32 - bits)).astype(np.int64)


def reference_gradient(params, records, labels) -> dict[str, np.ndarray]:
    """The mean-loss gradient in float64 numpy, by hand (no autodiff, no padding)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    rows = p["embed"].shape[0]
    grad = {k: np.zeros_like(v) for k, v in p.items()}
    for tokens, label in zip(records, labels, strict=True):
        index = _hash_np(np.asarray(tokens), rows)
        h = p["embed"][index].mean(axis=0)
        logits = h @ p["w"] + p["b"]
        prob = np.exp(logits - logits.max())
        prob /= prob.sum()
        prob[label] -= 1.0  # d loss / d logits
        grad["w"] += np.outer(h, prob)
        grad["b"] += prob
        np.add.at(grad["embed"], index, (p["w"] @ prob) / len(index))
    return {k: v / len(records) for k, v in grad.items()}


def dataset_loss(params, tokens: jax.Array, segments: jax.Array, labels: jax.Array) -> jax.Array:
    """The mean loss over a whole unpadded dataset in one call: ``tokens`` int32[T] of every
    record one after another, ``segments`` int32[T] their records, ``labels`` int32[N]."""
    embed = jnp.asarray(params["embed"])
    n = labels.shape[0]
    rows = embed[cm.hash_tokens(tokens, embed.shape[0])]
    sums = jax.ops.segment_sum(rows, segments, num_segments=n)
    counts = jax.ops.segment_sum(jnp.ones_like(segments, embed.dtype), segments, num_segments=n)
    logits = (sums / counts[:, None]) @ params["w"] + params["b"][None, :]
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))


def one_call_gradient(params, records, labels) -> dict[str, np.ndarray]:
    """``jax.grad(dataset_loss)`` over the whole unpadded dataset, in one float32 call."""
    tokens = np.concatenate(records).astype(np.int32)
    segments = np.repeat(np.arange(len(records)), [len(r) for r in records]).astype(np.int32)
    grad = jax.jit(jax.grad(dataset_loss))(params, tokens, segments, np.asarray(labels, np.int32))
    return {k: np.asarray(v, np.float64) for k, v in grad.items()}


def relative_error(got: dict, want: dict) -> float:
    diff = np.sqrt(sum(np.sum((np.asarray(got[k], np.float64) - want[k]) ** 2) for k in want))
    return float(diff / np.sqrt(sum(np.sum(want[k] ** 2) for k in want)))


def random_records(n: int, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    records = [rng.integers(0, 30522, int(rng.integers(1, 60))).astype(np.int32) for _ in range(n)]
    return records, rng.integers(0, 4, n).astype(np.int32)


def read_records(output: pathlib.Path, noise: cp.LabelNoise):
    """The prepared records and their observed labels, as every pass sees them."""
    table = pa.concat_tables(pq.read_table(f) for f in sorted(output.glob("data/records-*")))
    examples = [e for _, e in cp.examples(table, noise)]
    return [e["tokens"] for e in examples], np.array([e["label"] for e in examples])


# ---------------------------------------------------------------- pure kernels


def _padded_batches(records, labels, bucket: int, batch: int):
    for start in range(0, len(records), batch):
        chunk = records[start : start + batch]
        tokens = np.zeros((batch, bucket), np.int32)
        lengths = np.zeros(batch, np.int32)
        for i, r in enumerate(chunk):
            tokens[i, : len(r)] = r
            lengths[i] = len(r)
        label = np.zeros(batch, np.int32)
        label[: len(chunk)] = labels[start : start + batch]
        yield tokens, lengths, label, len(chunk)


def test_kernels_on_padded_batches_match_the_unpadded_references():
    params = cm.init_params(cm.ModelConfig(num_classes=4, hash_bits=6, dim=8), seed=1)
    records, labels = random_records(50)
    per_batch = jax.jit(jax.vmap(cm.gradient_kernel, in_axes=(None, 0, 0)))
    total = {k: np.zeros(v.shape) for k, v in params.items()}
    grand, el2n = [], []
    for tokens, lengths, label, n in _padded_batches(records, labels, bucket=64, batch=16):
        out = per_batch(params, {"tokens": tokens, "label": label}, {"L": lengths})
        for k in total:
            total[k] += np.asarray(out["grad"][k][:n], np.float64).sum(0)
        scores = cm.score_kernel(params, {"tokens": tokens, "label": label}, {"L": lengths})
        assert all(np.isfinite(np.asarray(v)).all() for v in scores.values())  # padded rows too
        grand += list(np.asarray(scores["grand"][:n]))
        el2n += list(np.asarray(scores["el2n"][:n]))
    mean = {k: v / len(records) for k, v in total.items()}
    want = reference_gradient(params, records, labels)
    assert relative_error(mean, want) <= MAX_RELATIVE_ERROR
    assert relative_error(one_call_gradient(params, records, labels), want) <= MAX_RELATIVE_ERROR

    # GraNd: the norm of one record's own gradient (unpadded); EL2N: |softmax - one_hot|.
    for i in (0, 17, 49):
        one = reference_gradient(params, [records[i]], labels[i : i + 1])
        norm = np.sqrt(sum(np.sum(v**2) for v in one.values()))
        np.testing.assert_allclose(grand[i], norm, rtol=1e-5)
        logits = cm.example_logits(params, jnp.asarray(records[i]), jnp.int32(len(records[i])))
        error = jax.nn.softmax(logits) - jax.nn.one_hot(labels[i], 4)
        np.testing.assert_allclose(el2n[i], np.linalg.norm(error), rtol=1e-5)


def test_label_noise_is_seeded_and_flips_to_another_class():
    classes = tuple("abcde")
    noise = cp.LabelNoise(classes, fraction=0.1, seed=3)
    pairs = [noise.observe(i, classes[i % 5]) for i in range(20000)]
    flipped = [(t, o) for t, o in pairs if t != o]
    assert 0.09 < len(flipped) / len(pairs) < 0.11
    assert pairs == [noise.observe(i, classes[i % 5]) for i in range(20000)]
    assert pairs != [
        cp.LabelNoise(classes, 0.1, 4).observe(i, classes[i % 5]) for i in range(20000)
    ]
    assert {(o - t) % 5 for t, o in flipped} == {1, 2, 3, 4}  # every other class, never itself
    assert all(
        t == o for t, o in (cp.LabelNoise(classes, 0.0, 3).observe(i, "c") for i in range(500))
    )
    with pytest.raises(ValueError, match="fraction"):
        cp.LabelNoise(classes, 1.0, 0)


def _inf_for_negative_tokens(params, element, lengths):
    return jnp.where(element["tokens"][0] < 0, jnp.inf, 1.0)


def test_a_pass_s_dead_letter_names_the_input_row_its_record_was_read_from(tmp_path):
    tokens = [[5, 6], [-1, 7], [8]]  # the second record's output is not finite
    records = pa.table(
        {"id": ["a", "b", "c"], "label": ["x", "y", "x"], "tokens": tokens,
         "source": ["in/rows.jsonl"] * 3, "row": [3, 9, 12]},
        schema=cr.records_schema(pa.string()),
    )  # fmt: skip
    noise = cp.LabelNoise(("x", "y"), fraction=0.0, seed=0)
    kernel = bj.RunKernel(
        _inf_for_negative_tokens,
        spec={"tokens": bj.ArraySpec(("L",), np.int32), "label": bj.ArraySpec((), np.int32)},
        keyed=True,
        bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=4),
        validation=bj.Validation(check_outputs_finite=True),
    )
    with beam.Pipeline("FnApiRunner") as pipeline:
        pairs = pipeline | beam.Create([records]) | beam.FlatMap(cp.examples, noise)
        _, dead = pairs | kernel.with_exception_handling()
        cp.write_dead_letters(dead, str(tmp_path), "score")
    (record,) = jobs.read_dead_letters(str(tmp_path / "_failed" / "score-*.jsonl"))
    assert (record.key, record.source, record.row, record.stage) == (
        "b",
        "in/rows.jsonl",
        9,
        "output",
    )


def test_auroc_and_precision():
    flipped = np.array([False, False, True, True, False])
    assert report.auroc(np.array([0.1, 0.2, 0.9, 0.8, 0.3]), flipped) == 1.0
    assert report.auroc(np.array([0.9, 0.8, 0.1, 0.2, 0.7]), flipped) == 0.0
    assert report.auroc(np.ones(5), flipped) == 0.5  # ties count half
    assert report.precision_at(np.array([0.1, 0.2, 0.9, 0.3, 0.4]), flipped, 0.2) == 1.0
    with pytest.raises(ValueError, match="positives and negatives"):
        report.auroc(np.ones(3), np.zeros(3, bool))


def test_flags():
    args, options = curate.parse_args([])
    assert args.input is None and args.passes == curate.DEFAULT_PASSES
    assert args.flip_fraction == 0.1 and args.classes == 10
    # A user's own labels are flipped only when asked.
    assert curate.parse_args(["--input", "rows.jsonl"])[0].flip_fraction == 0.0
    assert (
        curate.parse_args(["--input", "rows.jsonl", "--flip_fraction", "0.2"])[0].flip_fraction
        == 0.2
    )
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    args, options = curate.parse_args(["--runner", "DataflowRunner", "--passes", "3"])
    assert args.compilation_cache_dir is None and args.passes == 3
    with pytest.raises(SystemExit):
        curate.parse_args(["--flip_fraction", "1.5"])
    with pytest.raises(ValueError, match="cannot tell the format"):
        curate.parse_args(["--input", "rows.csv"])


def test_parquet_input_without_labels_is_refused_before_running(tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": [1], "text": ["A sentence."]}), path)
    with pytest.raises(ValueError, match="no column 'label'"):
        curate.run(["--input", str(path), "--output", str(tmp_path / "out")])


# ---------------------------------------------------------------- seeded runs


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("curate")
    summary = curate.run(["--output", str(out), "--runner=FnApiRunner"])
    return out, summary


def test_default_run_finds_the_flipped_labels(default_run):
    out, summary = default_run
    # Measured on CPython 3.11's corpus: ~0.95; chance is 0.5.
    best = max(summary.auroc[s] for s in report.SCORES)
    assert best >= 0.9, summary.auroc
    assert summary.auroc["random"] == 0.5
    assert summary.precision_at_top["grand"] > 3 * summary.precision_at_top["random"]
    assert 0.08 < summary.flipped / summary.records < 0.12
    losses = summary.losses
    assert len(losses) == curate.DEFAULT_PASSES + 1 and all(np.diff(losses) < 0), losses
    assert summary.seconds["total"] > 0  # timed, not bounded: speed belongs in bench/

    table = pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("scores-*.parquet")))
    assert table.num_rows == summary.records == summary.rows and summary.dead_letters == 0
    assert table.schema.names == [
        "id", "label", "true_label", "flipped", "grand", "el2n", "loss", "predicted"
    ]  # fmt: skip
    assert sorted(table.column("id").to_pylist()) == list(range(summary.records))
    t = table.to_pydict()
    assert all(
        (lab != true) == f
        for lab, true, f in zip(t["label"], t["true_label"], t["flipped"], strict=True)
    )
    assert set(t["true_label"]) == set(summary.classes)
    assert (out / "curate.png").stat().st_size > 10_000
    saved = json.loads((out / "summary.json").read_text())
    assert saved["auroc"] == summary.auroc and len(saved["losses"]) == len(losses)


def _copy_inputs(src: pathlib.Path, dst: pathlib.Path) -> None:
    shutil.copytree(src / "data", dst / "data")
    (dst / "passes").mkdir()
    shutil.copy(src / "passes" / "params-000.npz", dst / "passes")


@pytest.mark.parametrize(
    "name, bucketing, beam_flags",
    [
        ("planned", None, ["--runner=FnApiRunner"]),
        ("one bucket, odd batch", bj.Bucketing(boundaries={"L": (256,)}, batch_size=7),
         ["--runner=FnApiRunner"]),
        ("many buckets, big batch",
         bj.Bucketing(boundaries={"L": (4, 8, 16, 32, 64, 128, 256)}, batch_size=256),
         ["--runner=FnApiRunner"]),
        ("two worker processes", None,
         ["--runner=DirectRunner", "--direct_running_mode=multi_processing",
          "--direct_num_workers=2"]),
    ],
)  # fmt: skip
def test_full_batch_gradient_is_the_gradient_of_the_unpadded_loss(
    default_run, tmp_path, name, bucketing, beam_flags
):
    out, summary = default_run
    noise = cp.LabelNoise(summary.classes, 0.1, 0)
    records, labels = read_records(out, noise)
    params = bj.read_params(str(out / "passes" / "params-000.npz"))
    want = reference_gradient(params, records, labels)
    assert relative_error(one_call_gradient(params, records, labels), want) <= MAX_RELATIVE_ERROR

    if bucketing is None and len(beam_flags) == 1:
        saved = bj.read_params(str(out / "passes" / "gradient-000.npz"))  # the run's own pass
        count = int(saved["count"].item())
        got = {k: np.asarray(v, np.float64) / count for k, v in saved["total"]["grad"].items()}
    else:
        _copy_inputs(out, tmp_path)
        job = cp.Job(
            output=str(tmp_path),
            noise=noise,
            bucketing=bucketing
            or bj.Bucketing(boundaries={"L": summary.boundaries}, batch_size=64),
            options=PipelineOptions(beam_flags),
            compilation_cache_dir=None,
        )
        got, stats = cp.gradient_pass(job, 0)
        count = stats.count
        np.testing.assert_allclose(stats.loss, summary.passes[0].loss, rtol=1e-6)
        if "--direct_num_workers=2" in beam_flags:
            # Each process compiles the shapes it runs: both workers summed a share.
            assert stats.compiles > summary.passes[0].compiles
    assert count == len(records)
    assert relative_error(got, want) <= MAX_RELATIVE_ERROR, name


BAD_LINES = ("not JSON", "[1]")


def test_an_input_without_a_usable_row_is_refused_with_the_first_dead_letter(tmp_path):
    """It said "no usable rows; see the dead letters in ..." without a word of why."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "text": "A sentence."}\n{"id": "b", "text": "Another."}\n')
    why = "first of 2 dead letters failed its validation with InvalidElementError: expected"
    with pytest.raises(ValueError, match=f"{why} a non-empty string 'label'"):
        curate.run(["--input", str(path), "--output", str(tmp_path / "out")])
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ValueError, match="no rows to curate: .*empty.jsonl holds none"):
        curate.run(["--input", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "e")])


def test_bad_rows_are_dead_lettered(tmp_path):
    classes, rows = labelled_corpus(3)
    good = rows[:60]
    lines = [json.dumps({"id": f"r{i}", "text": t, "label": lab}) for i, t, lab in good]
    bad = {  # id -> stage
        "no-text": ({"id": "no-text", "label": classes[0]}, "validation"),
        "no-label": ({"id": "no-label", "text": "A fine sentence."}, "validation"),
        "int-label": ({"id": "int-label", "text": "A sentence.", "label": 3}, "read"),
        "empty": ({"id": "empty", "text": "  ", "label": classes[1]}, "tokenize"),
        "zero-width": ({"id": "zero-width", "text": "\u200b", "label": classes[1]}, "tokenize"),
    }
    lines += [json.dumps(row) for row, _ in bad.values()]
    lines += [json.dumps({"id": 5, "text": "An int id.", "label": classes[0]}), *BAD_LINES, ""]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"

    summary = curate.run(
        ["--input", str(path), "--output", str(out), "--passes", "1", "--flip_fraction", "0"]
    )

    failed = list(jobs.read_dead_letters(str(out / "_failed" / "*.jsonl")))
    got = sorted((repr(d.key), d.stage) for d in failed)
    for d in failed:  # each names its input line
        assert d.source == str(path), d
        line = lines[d.row]
        assert json.loads(line)["id"] == d.key if d.key is not None else line in BAD_LINES, d
    want = [(repr(k), stage) for k, (_, stage) in bad.items()]
    # Lines the reader cannot give the columns' types (an int id among string ids, not
    # JSON, not an object) are dead letters of the read.
    want += [("5", "read"), ("None", "read"), ("None", "read")]
    assert got == sorted(want)
    # A field of the wrong type is told the fix a command-line user has.
    said = {d.key: d.message for d in failed}
    assert "write each label as a JSON string" in said["int-label"], said["int-label"]
    assert "write every id as a string" in said[5], said[5]
    assert not any("schema argument" in m for m in said.values()), said
    assert summary.rows == len(lines) - 1 == summary.records + summary.dead_letters
    assert summary.records == len(good) and summary.classes == classes
    assert summary.dead_letters_by_stage == {
        "read": 4, "validation": 2, "tokenize": 2, "train": 0, "score": 0
    }  # fmt: skip
    assert summary.flipped == 0 and summary.auroc == {}  # nothing to find without flips
    table = pq.read_table(glob.glob(str(out / "scores-*.parquet"))[0])
    assert table.schema.field("id").type == pa.string() and table.num_rows == len(good)


def test_parquet_rows_keep_their_id_type_and_bad_rows_are_dead_lettered(tmp_path):
    classes, rows = labelled_corpus(3)
    ids = [i * 7 for i in range(len(rows[:40]))] + [None, 900, 901]
    texts = [t for _, t, _ in rows[:40]] + ["An id-less row.", None, "Labelled ''."]
    labels = [lab for *_, lab in rows[:40]] + [classes[0], classes[1], ""]
    table = pa.table(
        {"id": pa.array(ids, pa.int32()), "text": pa.array(texts, pa.large_string()),
         "label": labels}
    )  # fmt: skip
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=16)
    out = tmp_path / "out"
    summary = curate.run(["--input", str(tmp_path / "rows.parquet"), "--output", str(out),
                          "--passes", "1"])  # fmt: skip
    assert summary.rows == 43 and summary.records == 40
    assert summary.dead_letters_by_stage["validation"] == 3
    failed = list(jobs.read_dead_letters(str(out / "_failed" / "*.jsonl")))
    origins = sorted((d.row, d.key, d.source) for d in failed)
    parquet = str(tmp_path / "rows.parquet")
    assert origins == [(40, None, parquet), (41, 900, parquet), (42, 901, parquet)]
    scores = pq.read_table(next(out.glob("scores-*.parquet")))
    assert scores.schema.field("id").type == pa.int32()
    assert sorted(scores.column("id").to_pylist()) == ids[:40]
    bad = tmp_path / "bad.parquet"
    pq.write_table(table.set_column(2, "label", pa.array(range(43))), bad)
    with pytest.raises(ValueError, match="'label' of .* is int64; expected strings.*--label_"):
        curate.run(["--input", str(bad), "--output", str(tmp_path / "bad")])


def test_categorical_columns_are_read_as_their_values(tmp_path):
    """pandas categoricals (dictionary-encoded in Parquet): the launch refused such ids as
    neither integers nor strings, and the tokenizer refused such texts."""
    _, rows = labelled_corpus(3)
    plain = {"id": [f"r{i}" for i in range(30)], "text": [t for _, t, _ in rows[:30]],
             "label": [lab for *_, lab in rows[:30]]}  # fmt: skip
    scores = {}
    for name, columns in [
        ("plain", plain),
        ("categorical", {k: pa.array(v).dictionary_encode() for k, v in plain.items()}),
    ]:
        pq.write_table(pa.table(columns), tmp_path / f"{name}.parquet")
        out = tmp_path / name
        summary = curate.run(["--input", str(tmp_path / f"{name}.parquet"), "--output", str(out),
                              "--passes", "1"])  # fmt: skip
        assert summary.records == 30 and summary.dead_letters == 0, summary
        scores[name] = pq.read_table(next(out.glob("scores-*.parquet"))).sort_by("id")
    assert scores["categorical"].schema.field("id").type == pa.string()
    assert scores["categorical"].equals(scores["plain"])


def test_an_input_of_one_label_is_refused_saying_so(tmp_path):
    # No flips asked for: the message spoke of classes "to flip between".
    _, rows = labelled_corpus(3)
    lines = [
        json.dumps({"id": i, "text": t, "label": "spam"}) for i, (_, t, _) in enumerate(rows[:20])
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"one label, 'spam'.*at least 2.*--label_column") as e:
        curate.run(["--input", str(path), "--output", str(tmp_path / "out"), "--passes", "1"])
    assert "flip" not in str(e.value)


# ---------------------------------------------------------------- a user's own data


def _labelled_rows(path: pathlib.Path, n: int = 60) -> pathlib.Path:
    _, rows = labelled_corpus(3)
    lines = [json.dumps({"id": f"r{i}", "text": t, "label": lab}) for i, t, lab in rows[:n]]
    path.write_text("\n".join(lines) + "\n")
    return path


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {
        str(f.relative_to(directory)): f.read_bytes() for f in directory.rglob("*") if f.is_file()
    }


@pytest.fixture(scope="module")
def own_data_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("own")
    rows = _labelled_rows(tmp / "rows.jsonl")
    out = tmp / "out"
    summary = curate.run(["--input", str(rows), "--output", str(out), "--passes", "1"])
    return rows, out, summary


def test_a_users_labels_are_not_flipped_without_the_flag(own_data_run):
    _, out, summary = own_data_run
    assert summary.records == 60 and summary.flipped == 0 and summary.auroc == {}
    table = pa.concat_tables(pq.read_table(f) for f in sorted(out.glob("scores-*.parquet")))
    t = table.to_pydict()
    assert t["label"] == t["true_label"] and not any(t["flipped"])
    assert json.loads((out / "_curate.json").read_text())["job"]["flip_fraction"] == 0.0


def test_the_run_is_published_whole_and_nothing_stays_staged(own_data_run):
    _, out, _ = own_data_run
    names = set(_files(out))
    assert not any(n.startswith("_unfinished") for n in names), names
    assert {"summary.json", "curate.png", "_curate.json", "data/stats.json"} <= names
    assert any(n.startswith("passes/params-001") for n in names), names


def test_a_second_run_into_a_full_output_is_refused_and_leaves_it_intact(own_data_run):
    rows, out, _ = own_data_run
    before = _files(out)
    with pytest.raises(jobs.OutputExistsError, match="--overwrite"):
        curate.run(["--input", str(rows), "--output", str(out), "--passes", "2"])
    assert _files(out) == before


def test_an_output_that_is_a_file_is_refused_saying_so(own_data_run, tmp_path):
    rows, _, _ = own_data_run
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(jobs.OutputExistsError, match="afile is a file; expected a directory"):
        curate.run(["--input", str(rows), "--output", str(tmp_path / "afile")])
    assert (tmp_path / "afile").read_text() == "mine"


def test_the_command_line_says_why_a_second_run_is_refused(own_data_run, capsys):
    rows, out, _ = own_data_run
    with pytest.raises(SystemExit, match="OutputExistsError.*--overwrite"):
        curate.main(["--input", str(rows), "--output", str(out)])


def test_a_run_killed_while_publishing_is_finished_with_its_metrics_by_the_same_command(
    tmp_path, monkeypatch, capsys
):
    rows = _labelled_rows(tmp_path / "rows.jsonl", n=45)
    out = tmp_path / "out"
    flags = ["--input", str(rows), "--output", str(out), "--passes", "1", "--runner=FnApiRunner"]
    killed = subprocess.run(
        [sys.executable, "-m", "tests.kill_while_publishing", "curate", "all_moved", *flags],
        capture_output=True, text=True, cwd=ROOT, env=processes.worker_env(), timeout=600,
    )  # fmt: skip
    assert killed.returncode == kill_while_publishing.KILLED, killed.stderr[-3000:]
    assert not (out / "_curate.json").exists() and (out / "summary.json").exists()
    monkeypatch.setattr(curate_job, "prepare", lambda *a: pytest.fail("computed again"))

    summary = curate.run(flags)  # the same command again: no error, nothing computed

    assert "finished publishing the earlier run of this job" in capsys.readouterr().out
    assert json.loads((out / "_curate.json").read_text())["summary"] == str(summary)
    assert summary.records == 45 and len(summary.passes) == 1
    assert load_metrics(str(out))["summary"]["results"] == 45  # what beam-jax report reads
    assert not (out / "_unfinished").exists()
    with pytest.raises(jobs.OutputExistsError, match="already holds"):
        curate.run(flags)  # now a finished output


def test_overwrite_replaces_this_jobs_files_only(tmp_path):
    rows = _labelled_rows(tmp_path / "rows.jsonl", n=45)
    out = tmp_path / "out"
    (out / "data").mkdir(parents=True)
    (out / "data" / "notes.txt").write_text("a user's file")  # not the job's: kept
    (out / "passes").mkdir()
    (out / "passes" / "params-009.npz").write_bytes(b"an earlier run's pass")  # the job's
    summary = curate.run(
        ["--input", str(rows), "--output", str(out), "--passes", "1", "--overwrite"]
    )
    assert summary.records == 45
    files = _files(out)
    assert files["data/notes.txt"] == b"a user's file"
    assert "passes/params-009.npz" not in files and "passes/params-001.npz" in files


@pytest.mark.parametrize(
    "flag, hint",
    [
        ("--flip_fractoin", "--flip_fraction"),
        ("--overwrit", "--overwrite"),
        ("--pases", "--passes"),
    ],
)
def test_a_misspelled_flag_is_an_error_with_a_suggestion(tmp_path, capsys, flag, hint):
    argv = ["--output", str(tmp_path / "out"), flag, "1"]
    with pytest.raises(SystemExit):
        curate.run(argv)
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and f"did you mean {hint}" in err, err
    assert not (tmp_path / "out").exists()


def test_beam_flags_still_pass_through():
    _, options = curate.parse_args(["--direct_num_workers", "2", "--runner", "DirectRunner"])
    assert options.get_all_options()["direct_num_workers"] == 2


def test_progress_is_a_line_per_stage(tmp_path, capfd):
    rows = _labelled_rows(tmp_path / "rows.jsonl", n=30)
    curate.run(["--input", str(rows), "--output", str(tmp_path / "out"), "--passes", "2"])
    err = capfd.readouterr().err
    assert "curate: prepared 30 records from 30 rows" in err, err
    assert "curate: pass 1/2: loss" in err and "curate: pass 2/2: loss" in err, err
    assert "curate: scored 30 records" in err, err
    quiet = ["--input", str(rows), "--output", str(tmp_path / "q"), "--passes", "1"]
    curate.run([*quiet, "--no-progress"])
    assert "curate: pass" not in capfd.readouterr().err
