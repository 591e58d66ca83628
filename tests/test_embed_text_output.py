"""The flagship's output is never lost: staging, overwrite, threshold, flags, resume.

Earlier output is replaced only by a run that succeeded; a run that fails (at run time, or
over ``--threshold``) leaves it intact and says where its dead letters are; a misspelled
flag stops the launch; a run killed part-way resumes from the parts it wrote, ending
with the same files as a run that was never interrupted; and one killed while publishing is
finished by the same command, which computes nothing.
"""

from __future__ import annotations

import functools
import glob
import json
import pathlib
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

import beam_jax as bj
from beam_jax import jobs
from beam_jax._src.cli.report import load_metrics
from beam_jax._src.text import matmuls as matmuls_module
from beam_jax.text import SentenceEncoder
from pipelines.embed import job as embed_text
from pipelines.embed import write as text_parts
from tests import flagship as ft
from tests import kill_while_publishing, processes
from tests.kill_after_parts import KillAfterParts

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _files(out: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def _rows(n: int, start: int = 0, bad: tuple[int, ...] = ()) -> list[dict]:
    texts = ft.texts(n, start)
    return [
        {"id": start + i} if start + i in bad else {"id": start + i, "text": t}
        for i, t in enumerate(texts)
    ]


def _good_output(tmp_path) -> tuple[pathlib.Path, dict[str, bytes]]:
    source = ft.write_json_lines(tmp_path / "first.jsonl", _rows(10))
    out = tmp_path / "out"
    ft.run(source, out)
    return out, _files(out)


def _workers_cannot_load(encoder):
    raise RuntimeError("the model cannot be loaded on this worker (simulated)")


def test_a_run_that_fails_at_run_time_leaves_earlier_output_intact(tmp_path, monkeypatch):
    out, before = _good_output(tmp_path)
    source = ft.write_json_lines(tmp_path / "second.jsonl", _rows(5, start=100))
    # The model is checked at launch, so the failure is made where launch checks cannot
    # see it: loading the parameters in the workers.
    monkeypatch.setattr(SentenceEncoder, "load_params", _workers_cannot_load)

    with pytest.raises(Exception) as failure:  # noqa: B017 - the runner's own error type varies
        ft.run(source, out, "--overwrite")  # fails in the workers

    after = _files(out)
    assert {k: v for k, v in after.items() if not k.startswith("_unfinished/")} == before
    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == list(range(10)) and not failed  # still readable
    assert "nothing was published" in "".join(getattr(failure.value, "__notes__", []))


def test_output_that_holds_files_is_refused_without_overwrite(tmp_path):
    out, before = _good_output(tmp_path)
    with pytest.raises(jobs.OutputExistsError, match="already holds 3 files.*--overwrite"):
        ft.run(tmp_path / "first.jsonl", out)
    assert _files(out) == before

    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(jobs.OutputExistsError, match="notes.txt"):
        ft.run(tmp_path / "first.jsonl", other)


def test_overwrite_replaces_this_jobs_files_once_the_run_succeeds(tmp_path):
    out, _ = _good_output(tmp_path)
    (out / "notes.txt").write_text("not this job's")
    source = ft.write_json_lines(tmp_path / "second.jsonl", _rows(5, start=100, bad=(102,)))

    ft.run(source, out, "--overwrite")

    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == [100, 101, 103, 104] and [d["id"] for d in failed] == [102]
    assert (out / "notes.txt").read_text() == "not this job's"
    assert not (out / "_unfinished").exists()
    record = json.loads((out / "_embed_text.json").read_text())
    assert record["summary"].startswith("embed_text: 5 rows -> 4 embeddings, 1 dead letter")


def test_an_output_that_is_a_file_is_refused_saying_so(tmp_path):
    """It failed with ``NotADirectoryError: ... 'afile/_unfinished'``."""
    source = ft.write_json_lines(tmp_path / "first.jsonl", _rows(3))
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(jobs.OutputExistsError, match="afile is a file; expected a directory"):
        ft.run(source, tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "mine"


def test_threshold_publishes_nothing_and_names_the_file_of_dead_letters(tmp_path):
    out, before = _good_output(tmp_path)
    source = ft.write_json_lines(tmp_path / "bad.jsonl", _rows(10, start=50, bad=range(50, 55)))

    with pytest.raises(bj.DeadLetterThresholdError, match="5 of 10 rows failed") as failure:
        ft.run(source, out, "--overwrite", "--threshold", "0.2")

    dead = pathlib.Path(str(failure.value).split("dead letters are in ")[1].split(". ")[0])
    records = [
        bj.FailedElement.from_dict(json.loads(line)) for line in dead.read_text().splitlines()
    ]
    assert sorted(r.key for r in records) == [50, 51, 52, 53, 54]
    assert all("no 'text' field" in r.message and r.source == str(source) for r in records)
    assert {k: v for k, v in _files(out).items() if not k.startswith("_unfinished/")} == before

    # A higher threshold publishes the parts already computed, without recomputing them.
    summary = ft.run(source, out, "--overwrite", "--threshold", "0.5")
    assert summary.parts_reused == 1 and summary.rows == 0
    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == list(range(55, 60)) and len(failed) == 5


def test_misspelled_flag_is_an_error_and_nothing_runs(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_:
        embed_text.run(["--inptu", "x.parquet", "--output", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --inptu" in err and "did you mean --input" in err
    assert not out.exists()


def test_unfinished_parts_of_another_job_are_refused_unless_overwrite(tmp_path):
    out = jobs.OutputDir(str(tmp_path / "out"), layout=text_parts.LAYOUT)
    assert out.prepare({"inputs": "a"}, overwrite=False) == []
    part = "embeddings-a-000000000000-000000000003.parquet"
    (tmp_path / "out" / "_unfinished" / part).write_bytes(b"")
    assert out.prepare({"inputs": "a"}, overwrite=False) == [part]  # the same job: reused
    with pytest.raises(jobs.OutputExistsError, match="another job .*input files"):
        out.prepare({"inputs": "b"}, overwrite=False)
    assert out.prepare({"inputs": "b"}, overwrite=True) == []  # discarded
    assert out.staged_parts() == []


def test_a_publish_cut_short_is_finished_by_the_next_run(tmp_path):
    out = jobs.OutputDir(str(tmp_path / "out"), layout=text_parts.LAYOUT)
    (tmp_path / "out" / "_failed").mkdir(parents=True)
    (tmp_path / "out" / "embeddings-old-000000000000-000000000009.parquet").write_bytes(b"old")
    out.prepare({"inputs": "a"}, overwrite=True)
    staging = tmp_path / "out" / "_unfinished"
    new = [
        "embeddings-a-000000000000-000000000003.parquet",
        "_failed/failed-a-000000000000-000000000003.jsonl",
    ]
    for name in new:
        (staging / name).parent.mkdir(exist_ok=True)
        (staging / name).write_bytes(name.encode())
    (staging / "_publishing.json").write_text(json.dumps({"files": new, "record": {"r": 1}}))
    (staging / new[0]).rename(tmp_path / "out" / new[0])  # moved before the cut

    assert out.prepare({"inputs": "a"}, overwrite=True) == []

    expected = [*new, "_embed_text.json", "_unfinished/_job.json"]
    assert sorted(_files(tmp_path / "out")) == sorted(expected)
    assert all(_files(tmp_path / "out")[n] == n.encode() for n in new)


def _recomputes(*args, **kwargs):
    raise AssertionError("the rerun built the job's pipeline again")


@pytest.mark.parametrize(
    "point, earlier",
    [*((p, True) for p in kill_while_publishing.POINTS), ("all_moved", False)],
)
def test_a_run_killed_while_publishing_is_finished_by_the_same_command(
    tmp_path, monkeypatch, capsys, point, earlier
):
    out = tmp_path / "out"
    flags = ["--builtin_texts", "60", "--rows_per_part", "20", "--output", str(out)]
    flags += ["--runner=FnApiRunner", "--no-progress", *(["--overwrite"] if earlier else [])]
    if earlier:  # an earlier run's output, which the killed one was replacing
        out.mkdir()
        for name in ("embeddings-old-000000000000-000000000009.parquet", "_metrics.json"):
            (out / name).write_bytes(b"earlier")
        (out / "notes.txt").write_text("not the job's")
    killed = subprocess.run(
        [sys.executable, "-m", "tests.kill_while_publishing", "embed", point, *flags],
        capture_output=True, text=True, cwd=ROOT, env=processes.worker_env(), timeout=600,
    )  # fmt: skip
    assert killed.returncode == kill_while_publishing.KILLED, killed.stderr[-3000:]
    assert (out / "_unfinished" / "_publishing.json").exists()
    monkeypatch.setattr(embed_text, "_build", _recomputes)

    summary = embed_text.run(flags)  # the same command again: no error, nothing computed

    assert "finished publishing the earlier run of this job" in capsys.readouterr().out
    parts = [f"embeddings-builtin-{s:012d}-{s + 20:012d}.parquet" for s in (0, 20, 40)]
    kept = ["notes.txt"] if earlier else []
    assert sorted(_files(out)) == sorted([*parts, "_embed_text.json", "_metrics.json", *kept])
    table, failed = ft.read_outputs(out)
    assert sorted(ft.ids(table)) == list(range(60)) and not failed
    # The killed run's summary, in its record and its metrics (what beam-jax report reads).
    record = json.loads((out / "_embed_text.json").read_text())
    assert record["summary"] == str(summary)
    assert summary.rows == summary.results == 60 and summary.parts_written == 3
    assert load_metrics(str(out))["summary"]["results"] == 60
    with pytest.raises(jobs.OutputExistsError, match="already holds"):
        embed_text.run([f for f in flags if f != "--overwrite"])  # now a finished output


def test_a_killed_multiprocess_run_resumes_to_the_output_of_an_uninterrupted_one(
    tmp_path, monkeypatch
):
    for name, start, n in (("a", 0, 60), ("b", 1000, 30)):
        ft.write_json_lines(tmp_path / f"{name}.jsonl", _rows(n, start, bad=(7, 1010)))
    source, flags = tmp_path / "*.jsonl", ("--rows_per_part", "3")  # 30 parts
    ft.run(source, tmp_path / "uninterrupted", *flags)
    processes = ("--direct_running_mode=multi_processing", "--direct_num_workers=2")
    marker = tmp_path / "killed"
    killer = functools.partial(KillAfterParts, marker=str(marker), after=5)
    monkeypatch.setattr(embed_text, "EmbedParts", killer)  # SIGKILL after 5 parts, once
    out = tmp_path / "out"

    with pytest.raises(Exception) as failure:  # noqa: B017 - the runner's own error type varies
        ft.run(source, out, *flags, *processes)

    assert marker.exists(), "no worker was killed"
    written = sorted(glob.glob(str(out / "_unfinished" / "embeddings-*.parquet")))
    assert 5 <= len(written) < 30, len(written)
    assert "rerunning the same command resumes" in "".join(failure.value.__notes__)
    assert not glob.glob(str(out / "embeddings-*"))  # nothing published
    # --matmuls auto was decided once, at launch, for every worker; the record names it.
    here = matmuls_module.resolve("auto")
    assert json.loads((out / "_unfinished" / "_job.json").read_text())["matmuls"] == here
    with monkeypatch.context() as elsewhere:  # a machine that decides the other way
        units = (here == "float32", "another machine")
        elsewhere.setattr(matmuls_module, "_bfloat16_units", lambda device: units)
        with pytest.raises(jobs.OutputExistsError, match="another job .*different matmuls"):
            ft.run(source, out, *flags, *processes)  # would mix precisions: refused

    summary = ft.run(source, out, *flags, *processes)  # the same command again

    assert summary.parts_reused == len(written) and summary.parts_written == 30 - len(written)
    done, expected = _files(out), _files(tmp_path / "uninterrupted")
    assert sorted(done) == sorted(expected)  # the same parts, named by file and row range
    table, failed = ft.read_outputs(out)
    reference, reference_failed = ft.read_outputs(tmp_path / "uninterrupted")
    assert sorted(ft.ids(table)) == sorted(ft.ids(reference))  # every id exactly once
    assert len(set(ft.ids(table))) == 88
    vectors = dict(zip(ft.ids(table), table.column("embedding").to_pylist(), strict=True))
    reference_vectors = reference.column("embedding").to_pylist()
    for key, vector in zip(ft.ids(reference), reference_vectors, strict=True):
        np.testing.assert_allclose(vectors[key], vector, atol=1e-5)
    where = sorted((d["id"], d["file"], d["row"], d["stage"]) for d in failed)
    assert where == sorted((d["id"], d["file"], d["row"], d["stage"]) for d in reference_failed)
    assert [d["id"] for d in failed] == [7, 1010]


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.data())
def test_a_parts_results_are_gathered_in_row_order_from_any_batches(data):
    """``PartWriter`` gathers a part's vectors from the packed batches that hold its rows
    (each batch whole, or the rows of it that are the part's) straight into row order."""
    import pyarrow as pa

    from pipelines.embed.parts import KEY

    n = data.draw(st.integers(0, 30), label="rows")
    rows = np.asarray(data.draw(st.permutations(range(n))), np.int64)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4)))
    results = []
    for piece in np.split(rows, cuts):
        others = np.arange(1000, 1000 + data.draw(st.integers(0, 3)))  # another part's rows
        keys = np.concatenate([piece, others])
        order = np.asarray(data.draw(st.permutations(range(len(keys)))), np.int64)
        keys = keys[order]
        vectors = np.repeat(keys[:, None].astype(np.float32), 3, axis=1) + [0, 0.5, 0.25]
        batch = pa.RecordBatch.from_arrays(
            [pa.array((1 << 40) | keys), pa.FixedSizeListArray.from_arrays(vectors.ravel(), 3)],
            names=[KEY, text_parts.OUTPUT],
        )
        mine = np.flatnonzero(keys < 1000)
        results.append((batch, None if len(mine) == len(keys) else mine))

    done, vectors = text_parts._in_row_order(results)

    assert done.tolist() == list(range(n))
    expected = np.repeat(np.arange(n, dtype=np.float32)[:, None], 3, axis=1) + [0, 0.5, 0.25]
    assert len(vectors) == n
    if n:
        np.testing.assert_array_equal(vectors, expected)
