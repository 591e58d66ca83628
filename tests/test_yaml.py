"""Beam YAML: the provider listing and the example pipeline, through Beam's own entry points."""

from __future__ import annotations

import glob
import json
import pathlib

import apache_beam as beam
import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

import beam_jax as bj
from beam_jax import jobs
from tests.beam_helpers import pipeline, run
from tests.flagship import reference_embeddings, write_json_lines
from tests.kernels import D, attention_params, masked_attention_pool, reference_attention_pool

try:  # Beam's YAML front end needs extra packages (jinja2, ...); only its tests skip
    from apache_beam.yaml import main as yaml_main
    from apache_beam.yaml import yaml_transform
except ImportError as e:  # pragma: no cover - depends on the environment
    yaml_main = yaml_transform = None
    _NO_YAML = f"Beam YAML is not importable here: {e}"
else:
    _NO_YAML = ""
needs_yaml = pytest.mark.skipif(yaml_main is None, reason=_NO_YAML or "Beam YAML importable")

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "pipelines" / "embed_text.yaml"
PROVIDER = ROOT / "pipelines" / "beam_jax_provider.yaml"
TEXTS = {
    1: "A cat sat on the mat.",
    2: "Beam YAML pipelines read rows, transform them and write them.",
    3: "Dogs bark.",
}


_COLLECTED: dict = {}  # the in-process runner's results, by key


def _keep(kv) -> None:
    _COLLECTED[kv[0]] = np.asarray(kv[1])


@pytest.fixture(scope="module")
def expected() -> dict:
    """The encoder's embeddings of TEXTS, each alone, outside Beam."""
    return reference_embeddings(TEXTS)


def _json_rows(pattern: str) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(pattern)):
        rows += [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]
    return rows


@needs_yaml
def test_the_example_pipeline_runs_through_beams_yaml_main_on_parquet(tmp_path, expected):
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({"id": pa.array([*TEXTS, 4], pa.int64()), "text": [*TEXTS.values(), None]}),
        source,
        row_group_size=2,  # the bad row is the second group's second: row 3 of the file
    )
    output = tmp_path / "out" / "embeddings"
    variables = {"input": str(source), "output": str(output)}
    yaml_main.run(
        [f"--yaml_pipeline_file={EXAMPLE}", "--runner=FnApiRunner",
         f"--jinja_variables={json.dumps(variables)}"]
    )  # fmt: skip
    rows = _json_rows(f"{output}-0*")
    assert sorted(r["id"] for r in rows) == sorted(TEXTS)
    for r in rows:
        np.testing.assert_allclose(r["embedding"], expected[r["id"]], rtol=1e-5, atol=1e-6)
    (dead,) = [bj.FailedElement.from_dict(r) for r in _json_rows(f"{output}-failed-*.jsonl")]
    assert (dead.key, dead.stage, dead.error_type) == (4, "validation", "InvalidElementError")
    assert (dead.source, dead.row) == (str(source), 3)  # ReadRowsWithOrigin: file and row


def _json_pipeline(source, output) -> str:
    return f"""
pipeline:
  transforms:
    - type: ReadFromJson
      name: Read
      config:
        path: "{source}"
    - type: EmbedText
      name: Embed
      input: Read
      config:
        id_type: int
    - type: WriteToParquet
      input: Embed
      config:
        path: "{output}"
providers:
  - include: "{PROVIDER}"
"""


@needs_yaml
def test_embed_text_from_json_lines_through_yaml_transform_equals_run_kernel(tmp_path, expected):
    source = write_json_lines(
        tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in TEXTS.items()]
    )
    output = tmp_path / "out" / "embeddings"
    p = pipeline()
    yaml_transform.expand_pipeline(p, _json_pipeline(source, output))
    result = run(p)
    table = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(f"{output}*")))
    got = dict(
        zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True)
    )
    assert sorted(got) == sorted(TEXTS)
    for key, vector in got.items():
        np.testing.assert_allclose(vector, expected[key], rtol=1e-5, atol=1e-6)
    summary = bj.summarize(result)
    listed = len(_flagship_plan().shapes())
    assert 1 <= summary.compiles <= listed  # every compile is one of the listed shapes


def _flagship_plan():
    from beam_jax.text import EmbedText

    return EmbedText().kernel.plan(num_devices=len(jax.devices()))


def test_without_error_handling_a_bad_row_fails_the_pipeline_and_says_how_to_keep_going():
    p = pipeline()
    rows = p | beam.Create([beam.Row(id=1, text="fine"), beam.Row(id=2, text=None)])
    from pipelines.embed_yaml import EmbedText

    _ = rows | EmbedText()
    with pytest.raises(Exception, match="error_handling: {output: failed}"):
        run(p)


def test_with_error_handling_bad_rows_are_yaml_error_rows():
    from pipelines.embed_yaml import EmbedText

    p = pipeline()
    rows = p | beam.Create([beam.Row(id=1, text="fine"), beam.Row(id=None, text="no id")])
    outputs = rows | EmbedText(error_handling={"output": "failed"})
    assert_that(outputs["output"] | beam.Map(lambda r: r.id), equal_to([1]), label="Good")
    bad = outputs["failed"] | beam.Map(lambda r: (r.element.id, r.msg.split(":")[0]))
    assert_that(bad, equal_to([("None", "[validation] InvalidElementError")]), label="Bad")
    records = outputs["failed"] | beam.Map(
        lambda r: bj.FailedElement.from_dict(json.loads(r.dead_letter))
    )
    assert_that(
        records | beam.Map(lambda d: (d.key, d.stage, d.element)),
        equal_to([(None, "validation", "'no id'")]),
        label="DeadLetters",
    )
    run(p)


def test_configuration_errors_fail_at_construction():
    from pipelines.embed_yaml import EmbedText

    with pytest.raises(ValueError, match="id type must be one of"):
        EmbedText(id_type="float")
    with pytest.raises(ValueError, match="must name an output"):
        EmbedText(error_handling={"where": "x"})
    with pytest.raises(ValueError, match="rows_per_batch"):
        EmbedText(rows_per_batch=0)


def _kernel_pipeline(source, output, params) -> str:
    return f"""
pipeline:
  transforms:
    - type: ReadFromParquet
      name: Read
      config:
        path: "{source}"
    - type: RunKernelOnRows
      name: Pool
      input: Read
      config:
        kernel: tests.kernels.masked_attention_pool
        fields: {{x: {{shape: [L, {D}], dtype: float32}}}}
        boundaries: {{L: [4, 8, 16]}}
        batch_size: 8
        key_field: id
        params_path: "{params}"
        error_handling: {{output: failed}}
    - type: WriteToJson
      input: Pool
      config:
        path: "{output}"
    - type: WriteDeadLetters
      input: Pool.failed
      config:
        file_path_prefix: "{output}-failed"
providers:
  - include: "{PROVIDER}"
"""


def _to_pair(row) -> tuple:
    return row["id"], {"x": np.asarray(row["x"], np.float32).reshape(-1, D)}


@needs_yaml
def test_run_kernel_on_rows_in_yaml_equals_run_kernel_and_dead_letters_bad_rows(tmp_path):
    rng = np.random.default_rng(0)
    xs = {
        i: rng.standard_normal((int(rng.integers(1, 17)), D)).astype(np.float32) for i in range(12)
    }
    bad = np.ones((20, D), np.float32)  # longer than the largest bucket
    source = tmp_path / "in.parquet"
    pq.write_table(
        pa.table({
            "id": pa.array([*xs, 99], pa.int64()),
            "x": pa.array([x.reshape(-1) for x in [*xs.values(), bad]], pa.list_(pa.float32())),
        }),
        source,
    )  # fmt: skip
    params = tmp_path / "params.safetensors"
    bj.write_params(attention_params(), str(params))
    output = tmp_path / "out" / "pooled"
    _COLLECTED.clear()
    p = pipeline()
    yaml_transform.expand_pipeline(p, _kernel_pipeline(source, output, params))
    pairs = p | "ReadAgain" >> beam.io.ReadFromParquet(str(source)) | beam.Map(_to_pair)
    results, _ = pairs | bj.RunKernel(
        masked_attention_pool, spec={"x": bj.ArraySpec(("L", D), np.float32)},
        bucketing=bj.Bucketing(boundaries={"L": (4, 8, 16)}, batch_size=8),
        load_params=attention_params, keyed=True,
    ).with_exception_handling()  # fmt: skip
    _ = results | beam.Map(_keep)
    run(p)
    rows = _json_rows(f"{output}-0*")
    assert sorted(r["id"] for r in rows) == sorted(xs)
    for r in rows:
        np.testing.assert_allclose(r["output"], _COLLECTED[r["id"]], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(
            r["output"],
            reference_attention_pool(attention_params(), xs[r["id"]]),
            rtol=1e-4,
            atol=1e-5,
        )
    (failed,) = jobs.read_dead_letters(f"{output}-failed-*.jsonl")
    assert (failed.key, failed.stage, failed.error_type) == (
        99, "validation", "ElementTooLargeError",
    )  # fmt: skip


def test_run_kernel_on_rows_explains_a_bad_configuration():
    from beam_jax._src.inference.rows import RunKernelOnRows

    fields = {"x": {"shape": ["L", D]}}
    with pytest.raises(bj.SpecError, match="not an importable 'module.function'"):
        RunKernelOnRows("tests.kernels.nope", fields, {"L": [4]})
    with pytest.raises(bj.SpecError, match="needs a mapping with a shape"):
        RunKernelOnRows("tests.kernels.masked_attention_pool", {"x": [4]}, {"L": [4]})
    with pytest.raises(bj.SpecError, match="no bucket boundaries"):
        RunKernelOnRows("tests.kernels.masked_attention_pool", fields, {})
