"""safetensors with JAX's float types: the format against safetensors.numpy, parameter
files in bfloat16 through RunInference, and a bfloat16 checkpoint of a text model."""

import apache_beam as beam
import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from apache_beam.ml.inference.base import RunInference
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings
from hypothesis import strategies as st

import beam_jax as bj
from beam_jax import text
from beam_jax._src.core.tensor_file import read_safetensors, write_safetensors
from tests.beam_helpers import pipeline, run
from tests.tiny_bert import write_tiny_bert

THEIRS = ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
          "float16", "float32", "float64"]  # fmt: skip
OURS = [*THEIRS, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]


def _tensors(dtypes, seed, shapes):
    """Random bytes of each dtype (bools 0 or 1): NaNs and all, compared as bytes."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i, (dtype, shape) in enumerate(zip(dtypes, shapes, strict=True)):
        dtype, n = np.dtype(dtype), int(np.prod(shape))
        raw = rng.integers(0, 2 if dtype == np.bool_ else 256, n * dtype.itemsize, np.uint8)
        tensors[f"t{i}"] = raw.view(dtype).reshape(shape)
    return tensors


SHAPES = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@settings(max_examples=40, deadline=None)
@given(
    dtypes=st.lists(st.sampled_from(OURS), min_size=1, max_size=5),
    shapes=st.lists(SHAPES, min_size=5, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_tensors_round_trip_bit_for_bit_and_agree_with_safetensors(dtypes, shapes, seed):
    tensors = _tensors(dtypes, seed, shapes[: len(dtypes)])
    back = read_safetensors(write_safetensors(tensors))
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape
        assert back[name].tobytes() == t.tobytes()
    theirs = {n: t for n, t in tensors.items() if t.dtype.name in THEIRS}
    if theirs:  # the library reads ours, and we read the library's, where it has the dtype
        for name, t in safetensors.numpy.load(write_safetensors(theirs)).items():
            assert t.dtype == theirs[name].dtype and t.tobytes() == theirs[name].tobytes()
        for name, t in read_safetensors(safetensors.numpy.save(theirs)).items():
            assert t.dtype == theirs[name].dtype and t.tobytes() == theirs[name].tobytes()


def test_what_is_not_safetensors_is_refused_saying_so():
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_safetensors(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    with pytest.raises(ValueError, match="tensor 'c' has dtype complex64; safetensors holds"):
        write_safetensors({"c": np.ones(2, np.complex64)})


def _double(params, element, lengths):
    return (element["x"].astype(np.float32) * params["scale"].astype(np.float32)).sum()


def test_bfloat16_parameters_load_through_run_inference(tmp_path):
    """read_params failed with ``KeyError: 'BF16'`` (safetensors.numpy has no bfloat16)."""
    path = tmp_path / "p.safetensors"
    bj.write_params({"scale": np.array(2.5, ml_dtypes.bfloat16)}, str(path))
    loaded = bj.read_params(str(path))["scale"]
    assert loaded.dtype == ml_dtypes.bfloat16 and loaded.flags.writeable  # as .npz gives them
    with pytest.raises(bj.SpecError, match=r"\['scale'\] are of JAX's float types.*safetensors"):
        bj.write_params({"scale": np.array(2.5, ml_dtypes.bfloat16)}, str(tmp_path / "p.npz"))
    handler = bj.JaxModelHandler(
        _double,
        spec={"x": bj.ArraySpec(("L",), np.float32)},
        bucketing=bj.Bucketing(boundaries={"L": (4,)}, batch_size=2),
        params_path=str(path),
    )
    p = pipeline()
    got = (
        p
        | beam.Create([{"x": np.ones(n, np.float32)} for n in (1, 3)])
        | RunInference(handler)
        | beam.Map(lambda r: float(r.inference))
    )
    assert_that(got, equal_to([2.5, 7.5]))
    run(p)


def test_a_bfloat16_checkpoint_reads_as_its_float32_weights_rounded(tmp_path):
    model = write_tiny_bert(tmp_path / "model")
    config = text.SentenceEncoder.from_dir(model).config
    weights = model / "model.safetensors"
    full = text.read_weights(weights, config)
    raw = safetensors.numpy.load_file(str(weights))
    weights.write_bytes(
        write_safetensors({k: v.astype(ml_dtypes.bfloat16) for k, v in raw.items()})
    )
    halved = text.read_weights(weights, config)
    for got, want in zip(
        jax.tree_util.tree_leaves(halved), jax.tree_util.tree_leaves(full), strict=True
    ):
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want.astype(ml_dtypes.bfloat16).astype(np.float32))
