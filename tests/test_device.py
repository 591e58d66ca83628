"""The device check: the library's kernels on a GPU or TPU against float64 references.

Marked ``gpu`` (needs an accelerator): ``tests/conftest.py`` skips the module where JAX
sees only CPUs, unless one of two variables says otherwise:

* ``BEAM_JAX_REQUIRE_ACCELERATOR=1`` (what ``bench/device_check.sh`` sets): every test
  here runs and fails, saying so, when JAX finds no accelerator; JAX is not pinned to the
  CPU. A device check can then not pass on a machine whose accelerator plugin is missing.
* ``BEAM_JAX_DEVICE_TESTS_ON_CPU=1``: the tests run on the CPU (to work on them without
  an accelerator), with the CPU's float32 tolerances.

Each result is compared with a float64 numpy reference within a bound scaled to the
magnitude of the terms it sums (``sum |terms|``, not the result, which cancellation can
make small) and to the device's matmul precision: a TPU multiplies float32 inputs rounded
to bfloat16 by default (8 significant bits), an NVIDIA GPU of compute capability 8.0 or
later in TF32 (11 bits), a CPU in float32 (24 bits); ``precision=HIGHEST`` asks every
device for float32 products. The flagship's encoder (all-MiniLM-L6-v2's shapes, random
weights: ``tools/make_random_minilm.py``) runs on the device through ``EmbedText``, with
XLA's layers and with each layer as one Pallas kernel (``layer_kernel="pallas"``), and is
compared with the float32 encoder on the CPU by cosine; so are MPNet and XLM-RoBERTa
(``tests/tiny_families.py``, widths the kernel takes) with the default ``layer_kernel``.
Every test runs a real pipeline on the FnApiRunner, in this process (no sockets).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import pathlib
import sys

import apache_beam as beam
import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that

import beam_jax as bj
from beam_jax.testing import assert_conserved
from tests.beam_helpers import pipeline, run

pytestmark = pytest.mark.gpu

REQUIRE = os.environ.get("BEAM_JAX_REQUIRE_ACCELERATOR") == "1"
MODEL_DIR = os.environ.get("BEAM_JAX_DEVICE_MODEL_DIR")
"""A model directory with MiniLM's shapes to use (``bench/device_check.sh`` writes one);
default: one written for the module by ``tools/make_random_minilm.py``."""
D = 16
SPEC = {"x": bj.ArraySpec(("L", D), np.float32)}
F32 = 2.0**-24


@pytest.fixture(autouse=True, scope="module")
def accelerator():
    """The device under test; fails every test where an accelerator is required but absent."""
    device = jax.devices()[0]
    if REQUIRE and device.platform == "cpu":
        pytest.fail(
            f"BEAM_JAX_REQUIRE_ACCELERATOR=1 but JAX found only CPU devices {jax.devices()} "
            f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}, jax {jax.__version__}); "
            "expected a GPU or TPU. Install JAX for the accelerator (jax[tpu] with libtpu, or "
            "jax[cuda12]), check that no other process holds it, and leave JAX_PLATFORMS "
            "unset or naming it."
        )
    return device


def unit_roundoff(precision: str, device=None) -> float:
    """The relative rounding of a matmul's inputs on ``device`` at ``precision``.

    ``"default"``: a TPU rounds float32 inputs to bfloat16 (2^-8); an NVIDIA GPU of compute
    capability 8.0 or later multiplies in TF32 (2^-11); anything else in float32.
    ``"highest"``: float32 everywhere (a TPU's six bfloat16 passes come within a few ulps of
    it: 2^-21 there).
    """
    device = device or jax.devices()[0]
    if device.platform == "tpu":
        return 2.0**-8 if precision == "default" else 2.0**-21
    if device.platform in ("gpu", "cuda") and precision == "default":
        major = str(getattr(device, "compute_capability", "0")).split(".")[0]
        return 2.0**-11 if major.isdigit() and int(major) >= 8 else F32
    return F32


def bound(magnitude, precision: str, terms: int, rounds: int = 1):
    """How far a float32 device result may be from the exact sum of terms of absolute sum
    ``magnitude``: ``rounds`` matmuls whose inputs are rounded (2u each), plus float32
    accumulation over ``terms`` terms, twice for safety. Rigorous, not tight: a wrong
    bucket, row or padding shifts results by the order of ``magnitude`` itself."""
    u = unit_roundoff(precision)
    return 2 * (rounds * (2 * u + u * u) + terms * F32) * np.asarray(magnitude) + 1e-30


def check_within(got, want, tol, what: str) -> float:
    """Asserts ``|got - want| <= tol`` everywhere; returns the worst error / tol."""
    got, want, tol = (np.asarray(a, np.float64) for a in (got, want, tol))
    err = np.abs(got - want)
    worst = float(np.max(err / tol))
    assert worst <= 1, (
        f"{what}: the device's result is off by {np.max(err):.3g} where the bound is "
        f"{tol.flat[int(np.argmax(err / tol))]:.3g} (worst error/bound {worst:.2f}; "
        f"{jax.devices()[0].device_kind}, unit roundoff {unit_roundoff('default'):.3g})"
    )
    print(f"{what}: worst error / bound {worst:.3f}", file=sys.stderr)
    return worst


def weights(seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((D, D)).astype(np.float32)


def elements(n: int, top: int = 40, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((int(rng.integers(1, top + 1)), D)).astype(np.float32) for _ in range(n)
    ]


def _precision(name: str):
    return jax.lax.Precision.HIGHEST if name == "highest" else jax.lax.Precision.DEFAULT


def masked_sum(params, element, lengths, precision="default"):
    """Per element: ``sum over real rows of x @ W``, ``[D]``."""
    y = jnp.matmul(element["x"], params, precision=_precision(precision))
    mask = bj.length_mask(lengths["L"], y.shape[0])
    return jnp.sum(jnp.where(mask[:, None], y, jnp.float32(0)), axis=0)


def segment_sums(params, element, segments):
    """Per packed record: ``sum over its slots of x @ W``, ``[max_segments, D]``: the sums by
    ``where`` (no second matmul), so only ``x @ W`` is rounded."""
    y = jnp.matmul(element["x"], params)
    m = segments.lengths.shape[-1]
    one_hot = segments.ids[:, None] == jnp.arange(1, m + 1)[None, :]  # [row_length, m]
    return jnp.sum(jnp.where(one_hot[:, :, None], y[:, None, :], jnp.float32(0)), axis=0)


def references(values, w):
    """Exact ``sum_rows(x @ W)`` and the sum of its terms' magnitudes, in float64."""
    w64 = w.astype(np.float64)
    want = [(v.astype(np.float64) @ w64).sum(0) for v in values]
    magnitude = [(np.abs(v.astype(np.float64)) @ np.abs(w64)).sum(0) for v in values]
    return want, magnitude


def keyed_check(values, w, precision="default", what=""):
    """An ``assert_that`` check of keyed ``[D]`` results against the references."""
    want, magnitude = references(values, w)
    terms = max(len(v) for v in values) * D

    def check(actual):
        got = dict(actual)
        assert sorted(got) == list(range(len(values))), sorted(got)
        check_within(
            [got[i] for i in range(len(values))], want, bound(magnitude, precision, terms), what
        )

    return check


# --- the accelerator is there -----------------------------------------------------------


def test_jax_runs_on_an_accelerator_or_says_why_not(accelerator):
    print(f"JAX {jax.__version__}: {jax.devices()}", file=sys.stderr)
    x = jax.device_put(np.ones((128, 128), np.float32), accelerator)
    assert float(jnp.sum(x @ x)) == 128.0**3
    if REQUIRE:
        assert accelerator.platform != "cpu"


def test_the_tpu_counted_before_opening_is_the_one_that_opened(accelerator):
    """A launch plans for the devices it reads off the PCI bus before the TPU opens
    (``beam_jax.jobs.local_platform``); they must be those that opened, or its batch sizes
    and compiled shapes change with whether the TPU had opened yet."""
    from beam_jax._src import probe

    on_bus = probe._tpu_on_pci_bus()
    if on_bus is None:
        pytest.skip(f"no TPU on the PCI bus ({accelerator.platform})")
    opened = probe._open()
    assert (on_bus.platform, on_bus.device_count) == (opened.platform, opened.device_count)
    assert on_bus.kind == opened.kind


# --- RunKernel, ReduceKernel, FitToMemory through pipelines ------------------------------


@pytest.mark.parametrize("precision", ["default", "highest"])
def test_run_kernel_buckets_agree_with_float64_within_the_devices_precision(precision):
    values, w = elements(48), weights()
    p = pipeline()
    results = (
        p
        | beam.Create(list(enumerate({"x": v} for v in values)))
        | bj.RunKernel(
            functools.partial(masked_sum, precision=precision),
            spec=SPEC,
            bucketing=bj.Bucketing(boundaries={"L": (8, 16, 40)}, batch_size=8),
            load_params=lambda: w,
            keyed=True,
        )
    )
    assert_that(results, keyed_check(values, w, precision, f"RunKernel buckets, {precision}"))
    summary = assert_conserved(run(p))
    assert summary.results == 48 and summary.compiles >= 3 and summary.dead_letters == 0


def test_run_kernel_packing_agrees_with_float64():
    values, w = elements(60, top=24, seed=1), weights(8)
    p = pipeline()
    results = (
        p
        | beam.Create(list(enumerate({"x": v} for v in values)))
        | bj.RunKernel(
            segment_sums,
            spec=SPEC,
            packing=bj.Packing(row_lengths=(32, 64), rows_per_batch=(2, 4), max_segments=6),
            load_params=lambda: w,
            keyed=True,
        )
    )
    assert_that(results, keyed_check(values, w, what="RunKernel packing"))
    summary = assert_conserved(run(p))
    assert summary.results == 60 and summary.dead_letters == 0
    assert summary.padding_ratio > 1  # rows were packed and padded


def test_cross_bundle_mode_agrees_with_float64():
    values, w = elements(40, seed=2), weights(9)
    p = pipeline()
    results = (
        p
        | beam.Create(list(enumerate({"x": v} for v in values)))
        | bj.RunKernel(
            masked_sum,
            spec=SPEC,
            bucketing=bj.Bucketing(boundaries={"L": (16, 40)}, batch_size=8),
            load_params=lambda: w,
            keyed=True,
        ).with_cross_bundle_batching(max_wait_s=3600, shards=2)
    )
    assert_that(results, keyed_check(values, w, what="cross-bundle RunKernel"))
    summary = assert_conserved(run(p))
    assert summary.results == 40 and summary.buffering.waited == 40


def squared_error_grad(params, element, lengths):
    """``{grad: 2 X^T (X w - y), loss: |X w - y|^2}`` over the element's real rows."""
    x, y = element["x"], element["y"]
    mask = bj.length_mask(lengths["L"], x.shape[0])
    err = jnp.where(mask, x @ params - y, jnp.float32(0))
    return {"grad": 2 * (x.T @ err), "loss": jnp.sum(err * err)}


def test_reduce_kernel_sum_agrees_with_float64():
    rng = np.random.default_rng(3)
    data = []
    for _ in range(120):
        n = int(rng.integers(1, 33))
        data.append(
            {
                "x": rng.standard_normal((n, D)).astype(np.float32),
                "y": rng.standard_normal(n).astype(np.float32),
            }
        )
    w = rng.standard_normal(D).astype(np.float32)
    w64 = w.astype(np.float64)
    grad, loss = np.zeros(D), 0.0
    grad_terms, loss_terms = np.zeros(D), 0.0
    for e in data:
        x, y = e["x"].astype(np.float64), e["y"].astype(np.float64)
        err = x @ w64 - y
        grad += 2 * x.T @ err
        loss += float(err @ err)
        reach = np.abs(x) @ np.abs(w64) + np.abs(y)  # the magnitude each err sums
        grad_terms += 2 * np.abs(x).T @ reach
        loss_terms += float(reach @ reach)
    p = pipeline()
    total = (
        p
        | beam.Create(data)
        | bj.ReduceKernel(
            squared_error_grad,
            spec={"x": bj.ArraySpec(("L", D)), "y": bj.ArraySpec(("L",))},
            bucketing=bj.Bucketing(boundaries={"L": (8, 16, 32)}, batch_size=16),
            load_params=lambda: w,
        )
    )
    terms = 32 * D * 120  # the longest chain of float32 additions, across batches too

    def check(reductions):
        (r,) = reductions
        assert r.count == 120
        # Two rounded matmuls in a row (X w, then X^T err) and the product err * err.
        check_within(r.total["grad"], grad, bound(grad_terms, "default", terms, 2), "grad")
        check_within(r.total["loss"], loss, bound(loss_terms, "default", terms, 2), "loss")

    assert_that(total, check)
    assert assert_conserved(run(p)).results == 120


def test_fit_to_memory_analyses_on_the_device_and_its_limits_run(accelerator):
    from beam_jax.internal import fit_plan

    values, w = elements(64, top=64, seed=4), weights(10)
    bucketing = bj.Bucketing(boundaries={"L": (16, 64)}, batch_size=64)
    # A device states its memory; a CPU does not, so there the budget is stated.
    on_cpu = accelerator.platform == "cpu"
    fit = bj.FitToMemory(budget_bytes=4 << 20) if on_cpu else bj.FitToMemory()
    report = fit_plan(
        masked_sum,
        SPEC,
        bj.KernelOptions(
            bucketing=bucketing, load_params=lambda: w, fit_to_memory=fit
        ),  # fmt: skip
    )
    assert report.budget_source == ("stated" if on_cpu else "device")
    assert report.num_devices == len(jax.local_devices())
    for bucket, limit in report.limits.items():
        chosen = [r for r in report.rows if r.bucket == bucket and r.size == limit]
        assert chosen and chosen[0].fits and 0 < chosen[0].total <= report.budget, chosen
    print(
        f"FitToMemory on {accelerator.device_kind}: budget {report.budget} bytes, limits "
        f"{report.limits}",
        file=sys.stderr,
    )
    p = pipeline()
    results = (
        p
        | beam.Create(list(enumerate({"x": v} for v in values)))
        | bj.RunKernel(
            masked_sum,
            spec=SPEC,
            bucketing=bucketing,
            load_params=lambda: w,
            keyed=True,
            fit_to_memory=fit,
        )
    )
    assert_that(results, keyed_check(values, w, what="RunKernel with FitToMemory"))
    summary = assert_conserved(run(p))
    assert summary.results == 64 and summary.out_of_memory == 0


# --- the flagship's encoder --------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(tmp_path_factory):
    """A directory with all-MiniLM-L6-v2's shapes and random weights, and texts for it."""
    from beam_jax.text import builtin_corpus

    texts = [text for _, text in builtin_corpus(2000)][::40]  # 50, short and long
    if MODEL_DIR:
        return pathlib.Path(MODEL_DIR), texts
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "tools"))
    try:
        from make_random_minilm import write_random_minilm
    finally:
        sys.path.pop(0)
    return write_random_minilm(tmp_path_factory.mktemp("minilm") / "model"), texts


def cpu_embeddings(encoder, texts) -> np.ndarray:
    """The float32 encoder on the CPU, texts grouped by padded length (16, 32, ... 256)."""
    cpu = jax.devices("cpu")[0]
    ids = encoder.tokenizer().encode_batch(texts)
    with jax.default_device(cpu):
        params = jax.device_put(encoder.load_params(), cpu)
        fn = jax.jit(jax.vmap(encoder.element_fn, in_axes=(None, 0, 0)))
        out = np.zeros((len(texts), encoder.dim), np.float32)
        by_length: dict[int, list[int]] = {}
        for i, row in enumerate(ids):
            by_length.setdefault(max(16, 1 << math.ceil(math.log2(len(row)))), []).append(i)
        for length, rows in sorted(by_length.items()):
            padded = np.zeros((len(rows), length), np.int32)
            for j, i in enumerate(rows):
                padded[j, : len(ids[i])] = ids[i]
            lengths = np.array([len(ids[i]) for i in rows], np.int32)
            out[rows] = np.asarray(fn(params, {"input_ids": padded}, {"L": lengths}))
    return out


@pytest.fixture(scope="module")
def reference(minilm) -> np.ndarray:
    from beam_jax.text import SentenceEncoder

    path, texts = minilm
    return cpu_embeddings(
        SentenceEncoder.from_dir(path, matmuls="float32", layer_kernel="xla"), texts
    )


def embeds_like(encoder, texts, plan, reference, least, label, slices=(0,)) -> None:
    """Runs ``EmbedText(encoder)`` on ``texts`` (record batches cut at ``slices``) in a real
    pipeline on the device and checks every vector against ``reference`` by cosine."""
    from beam_jax.text import EmbedText

    batch = pa.record_batch({"doc": list(range(len(texts))), "body": texts})
    cuts = [*slices, len(texts)]
    p = pipeline()
    vectors, failed = (
        p
        | beam.Create([batch.slice(a, b - a) for a, b in itertools.pairwise(cuts)])
        | EmbedText(encoder, text_column="body", id_column="doc", batching=plan)
    )
    rows = vectors | beam.FlatMap(
        lambda b: zip(b.column("doc").to_pylist(), b.column("embedding").to_pylist(), strict=True)
    )

    def check(actual):
        got = dict(actual)
        assert sorted(got) == list(range(len(texts)))
        vectors = np.array([got[i] for i in range(len(texts))], np.float64)
        cosine = (vectors * reference).sum(1) / (
            np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1)
        )
        layers = encoder.resolved_layer_kernel()
        print(f"{label} ({layers} layers): least cosine {cosine.min():.6f}", file=sys.stderr)
        assert cosine.min() >= least, (label, layers, float(cosine.min()), least)

    assert_that(rows, check)
    assert_that(failed, lambda dead: not dead or pytest.fail(f"dead letters: {dead}"), label="Dead")
    run(p)


@pytest.mark.parametrize(
    "matmuls, batching, layers, least",
    [
        ("float32", "buckets", "xla", 0.9999),
        ("bfloat16", "packed", "xla", 0.999),
        ("bfloat16", "packed", "pallas", 0.999),
        ("bfloat16", "buckets", "pallas", 0.999),
    ],
)
def test_the_flagship_encoder_on_the_device_matches_float32_on_the_cpu(
    minilm, reference, matmuls, batching, layers, least
):
    from beam_jax.text import SentenceEncoder

    path, texts = minilm
    encoder = SentenceEncoder.from_dir(path, matmuls=matmuls, layer_kernel=layers)
    # One batch size per bucket or row length: a few compiles of a 6-layer model.
    plan = (
        bj.Bucketing(boundaries={"L": (64, 128, 256)}, batch_size=16, batch_sizes=(16,))
        if batching == "buckets"
        else bj.Packing(row_lengths=(128, 256), rows_per_batch=8, max_segments=8)
    )
    embeds_like(encoder, texts, plan, reference, least, f"{matmuls} {batching}", (0, 20))


@pytest.mark.parametrize("family", ["mpnet", "xlm-roberta"])
def test_other_families_with_the_default_layers_match_float32_on_the_cpu(tmp_path, family):
    """MPNet (per-head relative bias) and XLM-R (heads of 64) packed, with the default
    ``layer_kernel`` (on a TPU each layer one kernel): float32 matmuls on both sides."""
    from beam_jax.text import SentenceEncoder
    from tests import tiny_families as tf

    write = {"mpnet": tf.write_tiny_mpnet, "xlm-roberta": tf.write_tiny_xlm_roberta}[family]
    heads = {"mpnet": 8, "xlm-roberta": 4}[family]
    path = write(tmp_path / family, hidden=256, heads=heads, intermediate=512,
                 max_positions=130, max_seq_length=64)  # fmt: skip
    encoder = SentenceEncoder.from_dir(str(path))
    texts = tf.sample_texts(24, seed=21)
    want = cpu_embeddings(dataclasses.replace(encoder, layer_kernel="xla"), texts)
    plan = bj.Packing(row_lengths=(128,), rows_per_batch=4, max_segments=8)
    embeds_like(encoder, texts, plan, want, 0.9999, family)


def test_the_flagship_encoder_stored_whole_loads_on_the_device_untraced(minilm, tmp_path):
    """The encoder's programs (Pallas layers on a TPU), stored by one pipeline in its
    compilation cache, run untraced in the next with the same vectors, bit for bit."""
    from beam_jax.text import EmbedText, SentenceEncoder

    path, texts = minilm
    encoder = SentenceEncoder.from_dir(path, matmuls="bfloat16")
    plan = bj.Packing(row_lengths=(128, 256), rows_per_batch=8, max_segments=8)
    batch = pa.record_batch({"doc": list(range(len(texts))), "body": texts})

    def embed(name: str) -> tuple[bj.Summary, np.ndarray]:
        p = pipeline()
        vectors, _ = p | beam.Create([batch]) | EmbedText(
            encoder, text_column="body", id_column="doc", batching=plan,
            compilation_cache_dir=str(tmp_path / "cache"),
        )  # fmt: skip
        saved = tmp_path / f"{name}.npy"

        def save(batches):  # run from a pickled copy: the test reads the file back
            table = pa.Table.from_batches(batches).sort_by("doc")
            assert table.column("doc").to_pylist() == list(range(len(texts)))
            np.save(saved, np.array(table.column("embedding").to_pylist(), np.float32))

        assert_that(vectors, save)
        return bj.summarize(run(p)), np.load(saved)

    cold, first = embed("cold")
    warm, again = embed("warm")
    assert cold.compile_trace_seconds > 0 and warm.compile_trace_seconds == 0
    assert warm.compiles == cold.compiles >= 1
    assert first.shape == (len(texts), encoder.dim)
    np.testing.assert_array_equal(again, first)
