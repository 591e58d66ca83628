"""Every front end gives the same results and dead letters however a runner fuses its steps.

Each case builds a small pipeline of one front end (inputs with bad elements, so dead
letters flow) and runs it twice on the FnApiRunner: as built, and with a fusion break
between every pair of its steps. The break is Beam's own: every transform of the pipeline
gets an ``accelerator`` resource hint of its own, which gives it an environment of its
own, and the runner fuses no two steps of different environments (as Dataflow fuses no
step with a hinted one). The runner's stages are checked to hold one step each, so a
break that did not happen fails the test; results and dead letters (``FailedElement``
fields but the traceback) are compared as multisets, record batches row by row (how
rows are cut into batches is the runner's choice).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.ml.inference.base import RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.common_urns import resource_hints
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

import beam_jax as bj
from beam_jax.internal import origin_of
from beam_jax.jobs import WriteDeadLetters
from beam_jax.text import MAX_TOKENIZED_CHARS, EmbedText, EmbedTexts, SentenceEncoder
from beam_jax.yaml import RunKernelOnRows
from tests import tiny_bert

ACCELERATOR = resource_hints.ACCELERATOR.urn
SENTINEL = 13.0  # a row holding it makes the kernels below fail at run time
SPEC = {"x": bj.ArraySpec(("L", 2), np.float32)}
BUCKETING = bj.Bucketing(boundaries={"L": (4, 8)}, batch_size=4)
ONE_BUCKET = bj.Bucketing(boundaries={"L": (32,)}, batch_size=8)  # for the tiny text model


# --- kernels: small integers, so sums are exact whatever the batches ---------------------


def _refuse_sentinel(x):
    if np.any(x == SENTINEL):
        raise ValueError(f"kernel refuses the value {SENTINEL}")
    return x


def checked_sum(params, element, lengths):
    """The masked sum of ``x`` over its rows, times ``params``; fails on SENTINEL."""
    x = element["x"]
    x = jax.pure_callback(
        _refuse_sentinel, jax.ShapeDtypeStruct(x.shape, x.dtype), x, vmap_method="broadcast_all"
    )
    mask = bj.length_mask(lengths["L"], x.shape[0]).astype(jnp.float32)
    return jnp.sum(x * mask[:, None], axis=0) * params


def _params():
    return np.float32(2.0)


# --- the fusion break and its proof -------------------------------------------------------


def _nodes(pipeline: beam.Pipeline):
    todo = list(pipeline.transforms_stack[0].parts)
    while todo:
        node = todo.pop()
        yield node
        todo += node.parts


def break_fusion(pipeline: beam.Pipeline) -> None:
    """Gives every transform of ``pipeline`` an ``accelerator`` hint of its own.

    Composites get one too: the runner replaces a lifted ``CombinePerKey``'s parts with
    its own, in the composite's environment. An inner hint overrides an outer one.
    """
    for i, node in enumerate(_nodes(pipeline)):
        node.resource_hints = {ACCELERATOR: f"type:fusion-break-{i};count:1".encode()}


def fused_steps(pipeline: beam.Pipeline) -> list[set[str]]:
    """The FnApiRunner's stages for ``pipeline``, each as the steps (the pipeline's leaf
    transforms the SDK runs) that it fuses together."""
    proto = pipeline.to_runner_api()
    transforms = proto.components.transforms
    steps = {t.unique_name for t in transforms.values() if not t.subtransforms and t.environment_id}
    _, stages = FnApiRunner().create_stages(proto)
    return [{t.unique_name for t in s.transforms} & steps for s in stages]


# --- collecting outputs on the driver (the FnApiRunner runs in this process) ------------

_COLLECTED: dict[str, list] = collections.defaultdict(list)
_LOCK = threading.Lock()


def _collect(element: Any, run: str, name: str) -> None:
    with _LOCK:
        _COLLECTED[f"{run}/{name}"].append(element)


def _items(value: Any) -> list[Any]:
    """An output as comparable items: a record batch as its rows, each with the file and
    file row it was read from (how rows are cut into batches may change with fusion)."""
    if not isinstance(value, pa.RecordBatch):
        return [_canon(value)]
    path, first = origin_of(value)
    at = lambda i: None if first is None else first + i  # noqa: E731
    return [("row", path, at(i), _canon(r)) for i, r in enumerate(value.to_pylist())]


def _canon(value: Any) -> Any:
    """A hashable, comparable form of an output element."""
    if isinstance(value, bj.FailedElement):
        fields = dataclasses.asdict(value)
        del fields["traceback"]
        return ("FailedElement", _canon(fields))
    if isinstance(value, bj.Reduction):
        return ("Reduction", _canon(value.total), value.count)
    if hasattr(value, "_asdict"):  # a beam.Row, or the schema's NamedTuple it decodes to
        fields = dict(value._asdict())
        if "dead_letter" in fields:  # a YAML error row: its traceback is in two fields
            fields.pop("stack")
            record = json.loads(fields["dead_letter"])
            record.pop("traceback")
            fields["dead_letter"] = record
        return ("Row", _canon(fields))
    if isinstance(value, np.ndarray | np.generic):
        return ("array", str(value.dtype), value.shape, tuple(np.ravel(value).tolist()))
    if isinstance(value, dict):
        return tuple(sorted((k, _canon(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_canon(v) for v in value)
    return value


def _outputs(build: Callable, tmp: pathlib.Path, *, broken: bool):
    """Builds the case's pipeline, with or without the breaks, runs it and returns its
    outputs (each a multiset of canonical elements) and its stages' steps."""
    run = uuid.uuid4().hex
    p = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
    named = build(p, tmp)
    for name, pcoll in named.items():
        _ = pcoll | f"Collect{name}" >> beam.Map(_collect, run, name)
    if broken:
        break_fusion(p)
    stages = fused_steps(p)
    p.run().wait_until_finish()
    got = {
        n: collections.Counter(x for v in _COLLECTED.pop(f"{run}/{n}", []) for x in _items(v))
        for n in named
    }
    return got, stages


# --- the front ends -----------------------------------------------------------------------


def _elements() -> list[tuple[str, dict[str, np.ndarray]]]:
    """Keyed elements of two buckets, one the kernel refuses, two that fail validation."""
    good = [(f"k{i}", {"x": np.full((1 + i % 7, 2), i % 5, np.float32)}) for i in range(14)]
    good[5] = ("k5", {"x": np.full((3, 2), SENTINEL, np.float32)})
    return [
        *good,
        ("too-long", {"x": np.zeros((20, 2), np.float32)}),
        ("wrong-width", {"x": np.zeros((3, 5), np.float32)}),
    ]


def _kernel_options():
    return dict(spec=SPEC, bucketing=BUCKETING, load_params=_params)


def run_kernel(p, tmp):
    run = bj.RunKernel(checked_sum, keyed=True, **_kernel_options())
    run = run.with_exception_handling(threshold=0.5)
    _ = p | "StartWorkers" >> run.start_workers()
    results, dead = p | beam.Create(_elements()) | run
    return {"results": results, "dead": dead}


def run_kernel_across_bundles(p, tmp):
    run = bj.RunKernel(checked_sum, keyed=True, **_kernel_options())
    run = run.with_cross_bundle_batching(max_wait_s=3600, shards=2).with_exception_handling()
    results, dead = p | beam.Create(_elements()) | run
    return {"results": results, "dead": dead}


def reduce_kernel(p, tmp):
    reduce = bj.ReduceKernel(checked_sum, keyed=True, **_kernel_options())
    total, dead = p | beam.Create(_elements()) | reduce.with_exception_handling(threshold=0.5)
    return {"results": total, "dead": dead}


def reduce_kernel_across_bundles(p, tmp):
    reduce = bj.ReduceKernel(checked_sum, keyed=True, **_kernel_options())
    reduce = reduce.with_exception_handling().with_cross_bundle_batching(shards=2)
    total, dead = p | beam.Create(_elements()) | reduce
    return {"results": total, "dead": dead}


def _arrow_batches() -> list[pa.RecordBatch]:
    batches = []
    for start in (0, 8):
        ids, xs = [], []
        for key, value in _elements()[start : start + 8]:
            ids.append(key)
            xs.append(value["x"].ravel().tolist())
        batches.append(pa.record_batch({"id": ids, "x": xs}))
    batches.append(pa.record_batch({"id": ["null"], "x": pa.array([None], pa.list_(pa.float32()))}))
    return batches


def run_kernel_on_arrow(p, tmp):
    run = bj.RunKernelOnArrow(
        checked_sum, columns=bj.ArrowColumns(leaves={"x": "x"}, id="id"), **_kernel_options()
    ).with_exception_handling(threshold=0.5)
    results, dead = p | beam.Create(_arrow_batches(), reshuffle=False) | run
    return {"results": results, "dead": dead}


def _input_files(tmp: pathlib.Path) -> str:
    """A Parquet file of three row groups and a JSON-lines file with a bad line."""
    where = tmp / "in"
    if not where.exists():
        where.mkdir()
        table = pa.table({"id": list(range(10)), "text": [f"row {i}" for i in range(10)]})
        pq.write_table(table, where / "a.parquet", row_group_size=4)
        lines = [json.dumps({"id": 100 + i, "text": f"line {i}"}) for i in range(6)]
        lines[2] = '{"id": 102, "text": '  # cut short: not JSON
        lines[4] = json.dumps({"id": "not an int", "text": 4})
        (where / "b.jsonl").write_text("\n".join(lines) + "\n")
    return str(where / "*")


def read_arrow_batches(p, tmp, spread: bool = True):
    schema = pa.schema([("id", pa.int64()), ("text", pa.string())])
    read = bj.ReadArrowBatches(
        _input_files(tmp), schema=schema, key="id", max_rows=3, spread=spread
    )
    batches, dead = p | read.with_exception_handling()
    return {"results": batches, "dead": dead}


def read_arrow_batches_unspread(p, tmp):
    return read_arrow_batches(p, tmp, spread=False)


def write_dead_letters(p, tmp):
    prefix = tmp / f"failed-{uuid.uuid4().hex}" / "part"
    _, dead = (
        p
        | beam.Create(_elements())
        | bj.RunKernel(checked_sum, keyed=True, **_kernel_options()).with_exception_handling()
    )
    files = dead | WriteDeadLetters(str(prefix))
    lines = files | "ReadBack" >> beam.FlatMap(lambda f: pathlib.Path(f).read_text().splitlines())
    return {
        "dead": lines
        | "Parse" >> beam.Map(lambda line: bj.FailedElement.from_dict(json.loads(line)))
    }


def run_inference(p, tmp):
    handler = bj.KeyedJaxModelHandler(checked_sum, **_kernel_options())
    main, other = p | beam.Create(_elements()) | RunInference(handler).with_exception_handling()
    dead = other.failed_inferences | bj.FailedInferences(keyed=True)
    return {"results": main, "dead": dead}


def run_kernel_on_rows(p, tmp):
    rows = [beam.Row(id=k, x=v["x"].ravel().tolist()) for k, v in _elements()]
    out = (
        p
        | beam.Create(rows)
        | RunKernelOnRows(
            kernel=f"{__name__}.checked_sum",
            fields={"x": {"shape": ["L", 2], "dtype": "float32"}},
            boundaries={"L": [4, 8]},
            batch_size=4,
            error_handling={"output": "failed"},
        )
    )
    return {"results": out["output"], "dead": out["failed"]}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    # One layer, few shapes: the model compiles in a fraction of a second.
    path = tmp_path_factory.mktemp("tiny_bert")
    return str(tiny_bert.write_tiny_bert(path, layers=1, hidden=16, heads=2, intermediate=32))


def _texts() -> list[tuple[int, str | None]]:
    texts: list[Any] = list(enumerate(tiny_bert.sample_texts(10)))
    texts[3] = (3, None)  # validation
    texts[6] = (6, "word" + " " * (MAX_TOKENIZED_CHARS + 10) + "word")  # tokenize
    return texts


def embed_text(p, tmp, model: str):
    texts = _texts()
    batches = [
        pa.record_batch({"id": [i for i, _ in part], "text": [t for _, t in part]})
        for part in (texts[:5], texts[5:])
    ]
    embed = EmbedText(SentenceEncoder.from_dir(model), batching=ONE_BUCKET)
    vectors, dead = p | beam.Create(batches, reshuffle=False) | embed
    return {"results": vectors, "dead": dead}


def embed_text_packed(p, tmp, model: str):
    texts = _texts()
    batch = pa.record_batch({"id": [i for i, _ in texts], "text": [t for _, t in texts]})
    packing = bj.Packing(row_lengths=32, rows_per_batch=4, max_segments=8)
    embed = EmbedText(SentenceEncoder.from_dir(model), batching=packing)
    vectors, dead = p | beam.Create([batch], reshuffle=False) | embed
    return {"results": vectors, "dead": dead}


def embed_texts(p, tmp, model: str):
    texts = [*_texts(), (10, 10)]  # not a string: EmbedTexts' own dead letter
    embed = EmbedTexts(SentenceEncoder.from_dir(model), max_batch_size=4, batching=ONE_BUCKET)
    vectors, dead = p | beam.Create(texts) | embed.with_exception_handling()
    return {"results": vectors, "dead": dead}


def yaml_embed_text(p, tmp, model: str):
    from pipelines.embed_yaml import EmbedText as YamlEmbedText

    rows = [beam.Row(id=i, text=t) for i, t in _texts()]
    embed = YamlEmbedText(model_dir=model, rows_per_batch=4, error_handling={"output": "bad"})
    out = p | beam.Create(rows) | embed
    return {"results": out["output"], "dead": out["bad"]}


KERNEL_CASES = [
    run_kernel,
    run_kernel_across_bundles,
    reduce_kernel,
    reduce_kernel_across_bundles,
    run_kernel_on_arrow,
    read_arrow_batches,
    read_arrow_batches_unspread,
    write_dead_letters,
    run_inference,
    run_kernel_on_rows,
]
TEXT_CASES = [embed_text, embed_text_packed, embed_texts, yaml_embed_text]


def _plain_and_broken(build, tmp):
    """The outputs of ``build``'s pipeline as built and with the breaks, once the runner's
    stages show that the breaks happen: one step per stage, where without them some
    stages run several."""
    plain, plain_stages = _outputs(build, tmp, broken=False)
    broken, broken_stages = _outputs(build, tmp, broken=True)
    assert all(len(steps) <= 1 for steps in broken_stages), broken_stages
    assert any(len(steps) > 1 for steps in plain_stages), plain_stages
    assert len(broken_stages) > len(plain_stages)
    return plain, broken


def _check_same_under_breaks(build, tmp):
    plain, broken = _plain_and_broken(build, tmp)
    assert sum(plain["dead"].values()) > 0, plain  # dead letters flow
    assert broken == plain


@pytest.mark.parametrize("build", KERNEL_CASES, ids=lambda f: f.__name__)
def test_same_results_and_dead_letters_with_a_break_between_every_step(build, tmp_path):
    _check_same_under_breaks(build, tmp_path)


@pytest.mark.parametrize("build", TEXT_CASES, ids=lambda f: f.__name__)
def test_text_front_ends_same_with_a_break_between_every_step(build, tiny_model, tmp_path):
    _check_same_under_breaks(lambda p, tmp: build(p, tmp, tiny_model), tmp_path)


# --- the check itself ---------------------------------------------------------------------

_LAST_SEEN: list[Any] = [None]


def _remember(element):
    _LAST_SEEN[0] = element
    return element


def _pair_with_remembered(element):
    return element, _LAST_SEEN[0]


def relies_on_fusion(p, tmp):
    """Two steps that meet through a module global: right only when fused."""
    out = (
        p
        | beam.Create(range(6))
        | "Remember" >> beam.Map(_remember)
        | "Pair" >> beam.Map(_pair_with_remembered)
    )
    return {"results": out, "dead": p | "NoDead" >> beam.Create(["none"])}


def test_the_check_fails_a_front_end_whose_steps_meet_outside_pcollections(tmp_path):
    plain, broken = _plain_and_broken(relies_on_fusion, tmp_path)

    assert plain["results"] == collections.Counter((i, i) for i in range(6))
    assert broken["results"] != plain["results"]


# --- the curation job: each of its pipelines with the breaks --------------------------------


def _curate_outputs(out: pathlib.Path) -> dict[str, Any]:
    """The run's records, scores and dead letters as multisets of rows; its parameters."""
    from beam_jax.jobs import read_dead_letters

    def rows(pattern: str) -> collections.Counter:
        files = sorted(out.glob(pattern))
        return collections.Counter(_canon(r) for f in files for r in pq.read_table(f).to_pylist())

    dead = read_dead_letters(str(out / "_failed" / "*.jsonl"))
    with np.load(out / "passes" / "params-001.npz") as npz:
        params = {k: npz[k] for k in npz.files}
    return {
        "records": rows("data/records-*.parquet"),
        "scores": rows("scores-*.parquet"),
        "dead": collections.Counter(map(_canon, dead)),
        "params": params,
    }


def test_the_curation_job_gives_the_same_output_with_a_break_between_every_step(
    tmp_path, monkeypatch
):
    from beam_jax.text import labelled_corpus
    from pipelines import curate
    from pipelines.curate import passes

    classes, rows = labelled_corpus(3)
    lines = [json.dumps({"id": f"r{i}", "text": t, "label": lab}) for i, t, lab in rows[:24]]
    lines += [
        json.dumps({"id": "no-text", "label": classes[0]}),  # validation
        json.dumps({"id": "empty", "text": "  ", "label": classes[1]}),  # tokenize
        "not JSON",  # read
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n")
    flags = ["--input", str(path), "--passes", "1", "--flip_fraction", "0.2"]
    # Few shapes to compile: one bucket, one batch size, a small model.
    flags += ["--num_buckets", "1", "--batch_size", "16", "--batch_sizes", "16"]
    flags += ["--hash_bits", "6", "--dim", "8", "--runner=FnApiRunner"]

    curate.run([*flags, "--output", str(tmp_path / "plain")])
    run, stages = passes.run_pipeline, []

    def broken_run(pipeline):
        break_fusion(pipeline)
        stages.extend(fused_steps(pipeline))
        return run(pipeline)

    monkeypatch.setattr(passes, "run_pipeline", broken_run)
    curate.run([*flags, "--output", str(tmp_path / "broken")])

    assert stages and all(len(steps) <= 1 for steps in stages), stages
    plain, broken = _curate_outputs(tmp_path / "plain"), _curate_outputs(tmp_path / "broken")
    assert sum(plain["dead"].values()) == 3 and sum(plain["scores"].values()) == 24
    for name in ("records", "scores", "dead"):
        assert broken[name] == plain[name], name
    # The full-batch gradient sums the same rows, whichever batches they came in.
    assert broken["params"].keys() == plain["params"].keys()
    for name, value in plain["params"].items():
        np.testing.assert_allclose(broken["params"][name], value, rtol=1e-6, err_msg=name)
