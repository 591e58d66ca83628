"""Every front end and both jobs on Dask: beam_jax's DaskRunner against a real
``dask.distributed`` cluster (a scheduler and two worker processes, started here on
localhost: tests/dask_cluster.py), compared with the FnApiRunner.

- ``RunKernel``, ``RunKernelOnArrow`` and ``ReduceKernel`` (whole input and per window),
  each with bad records (``tests._matrix_job``): byte-identical results and dead letters.
- ``EmbedText``, ``EmbedTexts`` and ``RunInference`` with a ``KeyedJaxModelHandler``: the
  same ids and dead letters, vectors within 1e-6 (batches differ: bundles are partitions).
- ``python -m pipelines.embed`` and ``python -m pipelines.curate`` with
  ``--dask_client_address``: the same files and dead letters, floats within 1e-6 (relative
  to the array's scale for the curation's summed gradients).
- Parameters load, and shapes compile, once per worker process, not once per task.
- A worker SIGKILLed mid-job: retried once, the job completes with every row once; killed
  again, the job fails with its parts kept, and the same command resumes to a clean
  run's output.
- What the DaskRunner cannot run is refused at launch, before connecting, naming the step
  and the alternative; Beam's own DaskRunner is refused by every beam_jax transform.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import signal
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.ml.inference.base import RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream as _TestStream

import beam_jax as bj
import beam_jax.runners
from beam_jax.text import EmbedText, EmbedTexts, labelled_corpus
from pipelines import curate
from pipelines.embed import job as embed_text
from tests import _matrix_job as matrix
from tests import _runner_job as job
from tests import flagship as ft
from tests.dask_cluster import dask_cluster
from tests.kernels import D, attention_params, masked_attention_pool
from tests.kill_at_part import KillAtPart
from tests.processes import free_port, group_members, wait_until

pytestmark = pytest.mark.slow

FNAPI = ["--runner=FnApiRunner"]
BEAMS_DASK_RUNNER = "--runner=apache_beam.runners.dask.dask_runner.DaskRunner"
# Cross-bundle batching keeps rows in Beam state, which the DaskRunner does not have; it
# is refused there (test_what_dask_cannot_run_is_refused_at_launch...).
BRANCHES = tuple(b for b in matrix.BRANCHES if b != "cross_bundle")
TOLERANCE = 1e-6
ROOT = pathlib.Path(__file__).resolve().parent.parent
JOB_TIMEOUT_S = 600
# Every text of these tests in one shape: MiniLM compiles in seconds per shape and process.
TEXT_BATCHES = bj.Bucketing(boundaries={"L": (16,)}, batch_size=8, batch_sizes=(8,))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with dask_cluster(str(tmp_path_factory.mktemp("dask"))) as running:
        yield running


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    """A compilation cache the module's runs and workers share, as on a real cluster: a
    worker that a test kills starts again without compiling every shape again, and a job
    on Dask loads the shapes its FnApiRunner reference compiled (the same programs)."""
    return str(tmp_path_factory.mktemp("jax_cache"))


@pytest.fixture(scope="module")
def compilation_cache(cache_dir) -> list[str]:
    """The jobs' flag for the shared compilation cache."""
    return ["--compilation_cache_dir", cache_dir]


def _nowhere() -> list[str]:
    """Options of a DaskRunner whose scheduler does not exist: a job refused at launch
    never gets to connect (connecting would fail with another error)."""
    return [
        "--runner=beam_jax.runners.DaskRunner",
        f"--dask_client_address=tcp://127.0.0.1:{free_port()}",
    ]


# ------------------------------------------------------------------------- the front ends


def test_kernel_transforms_on_dask_give_the_fnapi_runners_bytes(cluster, cache_dir, tmp_path):
    parquet = str(tmp_path / "in.parquet")
    matrix.write_parquet(parquet)
    runs = {}
    for name, options in {
        "fnapi": FNAPI,
        "dask": cluster.options("--dask_npartitions=4"),  # 4 bundles over 2 workers
    }.items():
        out = str(tmp_path / name)
        result = matrix.run(
            options, out, parquet, branches=BRANCHES, compilation_cache_dir=cache_dir
        )
        runs[name] = (matrix.read_outputs(str(tmp_path / name), BRANCHES), result)

    (want, _), (got, result) = runs["fnapi"], runs["dask"]
    assert want["run"] and want["run_dead"] and len(want["reduce_windowed"]) == 3
    for name in want:
        assert got[name] == want[name], name
    for branch in BRANCHES:
        summary = bj.summarize(result, namespace=branch)
        assert summary.elements == job.N and summary.dead_letters == 10, (branch, summary)
        assert summary.conserved, (branch, summary)


def _vector_line(key, vector) -> str:
    return json.dumps([key, [float(v) for v in np.asarray(vector, np.float32)]])


def _batch_lines(batch: pa.RecordBatch) -> list[str]:
    ids, vectors = batch.column("id").to_pylist(), batch.column("embedding").to_pylist()
    return [_vector_line(i, v) for i, v in zip(ids, vectors, strict=True)]


def _inference_line(keyed) -> str:
    key, result = keyed
    return _vector_line(key, result.inference)


def _failed_inference_line(failed) -> str:
    batch, error = failed
    return json.dumps([len(batch), error[0].__name__])


def _text_job(pipeline: beam.Pipeline, out: str, parquet: str, cache_dir: str) -> None:
    """EmbedTexts over strings, EmbedText over record batches read from ``parquet``, and
    RunInference with a keyed handler; each with its dead letters, as lines under ``out``."""
    text = {"batching": TEXT_BATCHES, "compilation_cache_dir": cache_dir}
    texts = [f"Text number {i} is about {('dogs', 'cats', 'tea')[i % 3]}." for i in range(14)]
    vectors, failed = (
        pipeline
        | "Texts" >> beam.Create([*texts, None, 42])
        | "EmbedTexts" >> EmbedTexts(max_batch_size=5, **text).with_exception_handling()
    )
    batches = pipeline | "Read" >> bj.ReadArrowBatches(parquet, max_rows=4)
    embedded, embed_failed = batches | "EmbedText" >> EmbedText(**text)
    rng = np.random.default_rng(7)
    records = [
        (i, {"x": rng.standard_normal((1 + i % 9, D)).astype(np.float32)}) for i in range(20)
    ]
    handler = bj.KeyedJaxModelHandler(
        masked_attention_pool,
        spec={"x": bj.ArraySpec(("L", D), np.float32)},
        bucketing=bj.Bucketing(boundaries={"L": (16,)}, batch_size=8, batch_sizes=(8,)),
        load_params=attention_params,
        compilation_cache_dir=cache_dir,
        max_batch_duration_secs=None,  # Beam's stateful batching: refused on Dask
    )
    inferred, other = (
        pipeline
        | "Records" >> beam.Create(records)
        | "RunInference" >> RunInference(handler).with_exception_handling()
    )
    outputs = {
        "texts": vectors | "TextLines" >> beam.MapTuple(_vector_line),
        "texts_dead": failed | "TextDead" >> beam.Map(job.dead_letter_line),
        "batches": embedded | "BatchLines" >> beam.FlatMap(_batch_lines),
        "batches_dead": embed_failed | "BatchDead" >> beam.Map(job.dead_letter_line),
        "inference": inferred | "InferenceLines" >> beam.Map(_inference_line),
        "inference_failed": other.failed_inferences
        | "FailedLines" >> beam.Map(_failed_inference_line),
    }
    for name, lines in outputs.items():
        _ = lines | f"Write{name}" >> beam.io.WriteToText(os.path.join(out, name))


def _vectors(lines: list[str]) -> dict:
    return {json.dumps(k): np.asarray(v, np.float32) for k, v in map(json.loads, lines)}


def test_text_front_ends_and_the_inference_handler_on_dask_match_the_fnapi_runner(
    cluster, cache_dir, tmp_path
):
    parquet = tmp_path / "texts.parquet"
    rows = {
        "id": [f"doc-{i}" for i in range(10)],
        "text": [f"Document {i} reads well." for i in range(10)],
    }
    rows["text"][6] = None  # a dead letter of the tokenize step
    pq.write_table(pa.table(rows), parquet)
    got = {}
    for name, options in {"fnapi": FNAPI, "dask": cluster.options("--dask_npartitions=3")}.items():
        pipeline = beam.Pipeline(options=PipelineOptions(options))
        _text_job(pipeline, str(tmp_path / name), str(parquet), cache_dir)
        assert pipeline.run().wait_until_finish() == "DONE"
        names = ("texts", "texts_dead", "batches", "batches_dead", "inference", "inference_failed")
        got[name] = {n: job.read_lines(str(tmp_path / name), n + "-") for n in names}

    want, dask = got["fnapi"], got["dask"]
    assert len(want["texts"]) == 14 and len(want["texts_dead"]) == 2
    assert len(want["batches"]) == 9 and len(want["batches_dead"]) == 1
    assert len(want["inference"]) == 20 and not want["inference_failed"]
    for name in ("texts", "batches", "inference"):
        mine, theirs = _vectors(dask[name]), _vectors(want[name])
        assert mine.keys() == theirs.keys(), name
        for key, vector in theirs.items():
            np.testing.assert_allclose(mine[key], vector, rtol=0, atol=TOLERANCE, err_msg=key)
    for name in ("texts_dead", "batches_dead", "inference_failed"):
        assert dask[name] == want[name], name


# ------------------------------------------------------------- once per worker process


def test_parameters_and_compiled_shapes_load_once_per_worker_process(cluster, tmp_path):
    """Two kernel transforms (each its own parameters) over 12 bundles on 2 processes:
    each process loads each transform's parameters once, and compiles each shape once,
    whatever the number of tasks it ran (Beam's DaskRunner sets a DoFn up for every task)."""
    loaders = [job.RecordingLoader(str(tmp_path / f"loads_{i}")) for i in range(2)]
    pipeline = beam.Pipeline(options=PipelineOptions(cluster.options("--dask_npartitions=12")))
    elements = pipeline | beam.Create(range(job.N)) | beam.Map(job.make_element)
    for i, loader in enumerate(loaders):
        options = dict(matrix._options(f"once_{i}"), load_params=loader)
        run = bj.RunKernel(job.kernel, keyed=True, **options).with_exception_handling()
        results, _ = elements | f"Run{i}" >> run
        _ = (
            results
            | f"Lines{i}" >> beam.Map(job.result_line)
            | f"Write{i}" >> beam.io.WriteToText(str(tmp_path / f"out_{i}"))
        )
    result = pipeline.run()
    assert result.wait_until_finish() == "DONE"

    workers = cluster.worker_pids()
    shapes = len(bj.RunKernel(job.kernel, **matrix._options("shapes")).plan(num_devices=4).shapes())
    for i, loader in enumerate(loaders):
        loads = os.listdir(loader.log_dir)
        assert loader.pids() == workers, (loader.pids(), workers)  # both processes worked
        assert len(loads) == len(workers), loads  # once each, for 12 tasks
        summary = bj.summarize(result, namespace=f"once_{i}")
        assert summary.elements == job.N and summary.conserved, summary
        assert summary.compiles <= shapes * len(workers), (summary.compiles, shapes)
        print(f"transform {i}: 12 tasks on {len(workers)} processes: {len(loads)} loads, "
              f"{summary.compiles} compiles of {shapes} listed shapes")  # fmt: skip


# ------------------------------------------------------------------------------ the jobs


def _embed_input(directory: pathlib.Path) -> pathlib.Path:
    """60 rows (one bad: its text is a number) and a line that is no JSON."""
    rows = [{"id": i, "text": t} for i, t in enumerate(ft.texts(60))]
    rows[7]["text"] = 7
    return ft.write_json_lines(directory / "in.jsonl", [*rows, b"not JSON"])


def _files(out: pathlib.Path) -> dict[str, bytes]:
    """Every file of a run but its record and metrics (they hold timings)."""
    return {
        str(p.relative_to(out)): p.read_bytes()
        for p in sorted(out.rglob("*"))
        if p.is_file() and not p.name.startswith("_embed_text") and p.name != "_metrics.json"
    }


def _assert_same_embeddings(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    """The same files; dead letters byte for byte, parts with the same ids in the same
    order and vectors within 1e-6 (other runners batch the rows otherwise)."""
    assert got.keys() == want.keys()
    for name, data in want.items():
        if not name.startswith("embeddings-"):
            assert got[name] == data, name
            continue
        mine, theirs = (
            pq.read_table(pa.BufferReader(got[name])),
            pq.read_table(pa.BufferReader(data)),
        )
        assert mine.schema == theirs.schema and ft.ids(mine) == ft.ids(theirs), name
        np.testing.assert_allclose(
            _part_vectors(mine), _part_vectors(theirs), rtol=0, atol=TOLERANCE, err_msg=name
        )


def _part_vectors(table: pa.Table) -> np.ndarray:
    """A part's embeddings as ``[rows, D]`` (a part whose rows all failed has none)."""
    vectors = table.column("embedding").to_pylist()
    return np.asarray(vectors, np.float32).reshape(table.num_rows, -1 if vectors else 0)


# The fifth part of the first of the two bundles the parts are spread over: four parts are
# written before it, and ten after it are not yet.
KILLED_PART = "-000000000013-"


@pytest.fixture(scope="module")
def embed_reference(tmp_path_factory, compilation_cache):
    """The flagship on the FnApiRunner: its input, output and summary."""
    tmp = tmp_path_factory.mktemp("embed")
    source = _embed_input(tmp)
    summary = ft.run(source, tmp / "fnapi", "--rows_per_part", "3", *compilation_cache)
    assert summary.parts_written == 21 and summary.dead_letters == 2, summary
    return source, tmp / "fnapi", summary


def _embed_on(cluster, cache, source, out):
    argv = ["--input", str(source), "--output", str(out), "--rows_per_part", "3", *cache]
    return embed_text.run([*argv, *cluster.options()])


def _python_m(module: str, *argv: str) -> str:
    """``python -m MODULE ARGV...`` as a user types it, in its own process group (which
    must end with it); returns what it printed."""
    cmd = [sys.executable, "-m", module, *argv]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        log, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert wait_until(lambda: not group_members(proc.pid), 30), "the job left processes"
    assert proc.returncode == 0, log
    return log


def test_python_m_pipelines_embed_on_dask_writes_the_fnapi_runners_files(
    cluster, compilation_cache, embed_reference, tmp_path
):
    """The command line, with the DaskRunner's own option passing through the job's flags."""
    source, reference, want = embed_reference
    out = tmp_path / "out"
    argv = ["--input", str(source), "--output", str(out), "--rows_per_part", "3"]

    _python_m("pipelines.embed", *argv, *compilation_cache, *cluster.options())

    summary = json.loads((out / "_metrics.json").read_text())["summary"]
    assert summary["conserved"] and summary["parts_written"] == want.parts_written, summary
    got = (summary["rows"], summary["results"], summary["dead_letters_by_stage"])
    assert got == (want.rows, want.results, want.dead_letters_by_stage)
    _assert_same_embeddings(_files(out), _files(reference))


def test_a_killed_worker_is_retried_and_the_job_writes_every_row_once(
    cluster, compilation_cache, embed_reference, tmp_path, monkeypatch
):
    """A worker SIGKILLed right after writing a part: its nanny restarts it, Dask runs the
    task again, the job completes, and its output is an uninterrupted run's (the summary's
    counts too: a retried task's metrics count once)."""
    source, reference, want = embed_reference
    marker = tmp_path / "killed"
    killer = functools.partial(KillAtPart, marker=str(marker), part=KILLED_PART)
    monkeypatch.setattr(embed_text, "EmbedParts", killer)

    summary = _embed_on(cluster, compilation_cache, source, tmp_path / "out")

    pids = marker.read_text().split()
    assert len(pids) == 1 and int(pids[0]) != os.getpid(), pids  # a worker was killed once
    assert summary.conserved and summary.parts_written == want.parts_written, summary
    assert summary.results == want.results and summary.dead_letters == want.dead_letters
    _assert_same_embeddings(_files(tmp_path / "out"), _files(reference))
    cluster.wait_for_workers()  # the nanny restarted it


def test_a_worker_killed_twice_fails_the_job_keeping_its_parts_and_a_rerun_resumes(
    cluster, compilation_cache, embed_reference, tmp_path, monkeypatch
):
    """The same task killed twice exceeds the cluster's retries (one): the job fails,
    nothing is published, the parts written are kept, and the same command again writes
    only the rest, ending with an uninterrupted run's output."""
    from distributed.scheduler import KilledWorker

    source, reference, want = embed_reference
    marker = tmp_path / "killed"
    killer = functools.partial(KillAtPart, marker=str(marker), part=KILLED_PART, times=2)
    monkeypatch.setattr(embed_text, "EmbedParts", killer)
    out = tmp_path / "out"

    with pytest.raises(KilledWorker):
        _embed_on(cluster, compilation_cache, source, out)

    assert len(marker.read_text().split()) == 2
    cluster.wait_idle()  # the other bundle's task may still be writing its parts
    kept = sorted(p.name for p in (out / "_unfinished").glob("embeddings-*.parquet"))
    assert any(KILLED_PART in name for name in kept), kept  # written before the kill
    assert len(kept) < want.parts_written
    assert not list(out.glob("embeddings-*")), "a failed job publishes nothing"
    cluster.wait_for_workers()
    monkeypatch.undo()

    summary = _embed_on(cluster, compilation_cache, source, out)  # the same command again

    assert summary.parts_reused == len(kept), summary
    assert summary.parts_written == want.parts_written - len(kept), summary
    _assert_same_embeddings(_files(out), _files(reference))


def _curate_input(path: pathlib.Path) -> pathlib.Path:
    classes, rows = labelled_corpus(3)
    lines = [json.dumps({"id": f"r{i}", "text": t, "label": lab}) for i, t, lab in rows[:40]]
    lines += [
        json.dumps({"id": "no-text", "label": classes[0]}),  # validation
        json.dumps({"id": "empty", "text": "  ", "label": classes[1]}),  # tokenize
        "not JSON",  # read
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _curate_outputs(out: pathlib.Path) -> dict:
    scores = pa.concat_tables(pq.read_table(p) for p in sorted(out.glob("scores-*.parquet")))
    failed = sorted(
        line for p in out.glob("_failed/*.jsonl") for line in p.read_text().splitlines()
    )
    gradients = {}
    for path in sorted(out.glob("passes/gradient-*.npz")):
        with np.load(path) as npz:
            gradients.update({f"{path.name}:{k}": npz[k] for k in npz.files})
    return {"scores": scores.sort_by("id"), "failed": failed, "gradients": gradients}


def test_python_m_pipelines_curate_on_dask_matches_the_fnapi_runner(
    cluster, compilation_cache, tmp_path
):
    source = _curate_input(tmp_path / "rows.jsonl")
    flags = ["--input", str(source), "--passes", "1", "--flip_fraction", "0.1", *compilation_cache]
    flags += ["--num_buckets", "1", "--batch_size", "64", "--batch_sizes", "64"]  # one shape
    want = curate.run([*flags, "--output", str(tmp_path / "fnapi"), *FNAPI])
    _python_m("pipelines.curate", *flags, "--output", str(tmp_path / "dask"), *cluster.options())

    got = json.loads((tmp_path / "dask" / "summary.json").read_text())
    assert (got["rows"], got["records"], got["flipped"], got["dead_letters_by_stage"]) == (
        want.rows, want.records, want.flipped, want.dead_letters_by_stage,
    )  # fmt: skip
    assert want.records == 40 and sum(want.dead_letters_by_stage.values()) == 3
    theirs, mine = _curate_outputs(tmp_path / "fnapi"), _curate_outputs(tmp_path / "dask")
    assert mine["failed"] == theirs["failed"] and len(theirs["failed"]) == 3
    assert mine["gradients"].keys() == theirs["gradients"].keys()
    for key, total in theirs["gradients"].items():  # sums over 40 records, batched otherwise
        scale = max(1.0, float(np.abs(total).max()))
        np.testing.assert_allclose(
            mine["gradients"][key], total, rtol=0, atol=TOLERANCE * scale, err_msg=key
        )
    scores, reference = mine["scores"].to_pydict(), theirs["scores"].to_pydict()
    for column, values in reference.items():
        if isinstance(values[0], float):
            np.testing.assert_allclose(
                scores[column], values, rtol=0, atol=TOLERANCE, err_msg=column
            )
        else:
            assert scores[column] == values, column


# --------------------------------------------------------------------------- refusals


def _cross_bundle(pipeline):
    elements = pipeline | beam.Create(range(6)) | beam.Map(job.make_element)
    run = bj.RunKernel(job.kernel, keyed=True, **matrix._options("refused"))
    _ = elements | run.with_cross_bundle_batching(max_wait_s=1.0)


def _stateful_batching(pipeline):
    handler = bj.JaxModelHandler(masked_attention_pool, spec={"x": bj.ArraySpec(("L", D))},
                                 bucketing=bj.Bucketing(boundaries={"L": (4, 8)}))  # fmt: skip
    _ = pipeline | beam.Create([{"x": np.ones((2, D), np.float32)}]) | RunInference(handler)


_COUNT = beam.transforms.userstate.CombiningValueStateSpec("count", sum)
_COUNT_STATE = beam.DoFn.StateParam(_COUNT)


class _CountPerKey(beam.DoFn):
    def process(self, element, count=_COUNT_STATE):
        count.add(1)
        yield element


def _own_stateful(pipeline):
    _ = pipeline | beam.Create([("a", 1)]) | beam.ParDo(_CountPerKey())


class _Ranges(beam.transforms.core.RestrictionProvider):
    def initial_restriction(self, element):
        return OffsetRange(0, element)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()


_RANGE = beam.DoFn.RestrictionParam(_Ranges())


class _Splittable(beam.DoFn):
    def process(self, element, tracker=_RANGE):
        position = tracker.current_restriction().start
        while tracker.try_claim(position):
            yield position
            position += 1


def _splittable(pipeline):
    _ = pipeline | beam.Create([3]) | beam.ParDo(_Splittable())


class _Primitive(beam.PTransform):
    """A primitive of one's own: a bounded PCollection out of nothing, as Impulse is."""

    def expand(self, pbegin):
        return beam.pvalue.PCollection(pbegin.pipeline, is_bounded=True)

    def get_windowing(self, inputs):
        return beam.Windowing(beam.window.GlobalWindows())


def _untranslatable(pipeline):
    _ = pipeline | _Primitive() | beam.Map(str)


def _test_stream(pipeline):
    _ = pipeline | _TestStream().add_elements([1]) | beam.Map(str)


@pytest.mark.parametrize(
    "build, flags, says",
    [
        (
            _cross_bundle,
            [],
            r"'RunKernel/.*CrossBundleDoFn.*state.*drop \.with_cross_bundle_batching",
        ),
        (_stateful_batching, [], r"BatchElements.*max_batch_duration_secs=None"),
        (_own_stateful, [], r"'ParDo\(_CountPerKey\)'.*state.*Run this pipeline on Prism"),
        (_splittable, [], r"'ParDo\(_Splittable\)'.*splittable DoFn.*ReadArrowBatches"),
        (
            _untranslatable,
            [],
            r"'_Primitive' \(_Primitive\) is a primitive transform .*no translation",
        ),
        (_test_stream, [], r"unbounded PCollection.*Prism"),
        (
            lambda p: p | beam.Create([1]) | beam.Map(str),
            ["--streaming"],
            r"bounded \(batch\).*--streaming",
        ),
    ],
    ids=[
        "cross_bundle",
        "stateful_batch_elements",
        "own_stateful",
        "splittable",
        "untranslatable",
        "test_stream",
        "streaming",
    ],  # fmt: skip
)
def test_what_dask_cannot_run_is_refused_at_launch_naming_the_step_and_the_alternative(
    build, flags, says
):
    pipeline = beam.Pipeline(options=PipelineOptions([*_nowhere(), *flags]))
    build(pipeline)
    with pytest.raises(beam_jax.runners.UnsupportedOnDaskError, match=says):
        pipeline.run()


def _front_ends(parquet: str):
    options = dict(spec={"x": bj.ArraySpec(("L", D), np.float32)}, bucketing=job.BUCKETING)
    columns = bj.ArrowColumns(leaves={"x": "x"})
    return {
        "RunKernel": lambda p: p | beam.Create([]) | bj.RunKernel(masked_attention_pool, **options),
        "RunKernelOnArrow": lambda p: (
            p
            | beam.Create([])
            | bj.RunKernelOnArrow(masked_attention_pool, columns=columns, **options)
        ),
        "ReduceKernel": lambda p: (
            p | beam.Create([]) | bj.ReduceKernel(masked_attention_pool, **options)
        ),
        "EmbedText": lambda p: p | beam.Create([]) | EmbedText(),
        "EmbedTexts": lambda p: p | beam.Create([]) | EmbedTexts(),
        "ReadArrowBatches": lambda p: p | bj.ReadArrowBatches(parquet),
    }


def test_beams_own_dask_runner_is_refused_by_every_front_end_as_it_is_built(tmp_path):
    parquet = str(tmp_path / "in.parquet")
    matrix.write_parquet(parquet)
    for name, build in _front_ends(parquet).items():
        pipeline = beam.Pipeline(options=PipelineOptions([BEAMS_DASK_RUNNER]))
        with pytest.raises(beam_jax.runners.UnsupportedOnDaskError) as caught:
            build(pipeline)
        message = str(caught.value)
        assert message.startswith(name) and "--runner=beam_jax.runners.DaskRunner" in message, (
            message
        )


def test_the_flagship_on_beams_own_dask_runner_is_refused_at_launch(tmp_path):
    """Not ``'NoneType' object has no attribute 'map'`` from inside the job: a refusal that
    names the runner to use, before anything is read or written."""
    source = _embed_input(tmp_path)
    with pytest.raises(
        beam_jax.runners.UnsupportedOnDaskError, match="beam_jax.runners.DaskRunner"
    ):
        embed_text.run(
            ["--input", str(source), "--output", str(tmp_path / "out"), BEAMS_DASK_RUNNER]
        )
    assert not list((tmp_path / "out").glob("**/*.parquet"))
