"""Model directories on any Beam file system: read through ``FileSystems``, copied to local
disk once per process (beam_jax.text.local_model_dir, SentenceEncoder.from_dir)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from apache_beam.io.localfilesystem import LocalFileSystem

from beam_jax import text
from beam_jax.text import SentenceEncoder
from tests.tiny_bert import sample_texts, write_tiny_bert

SCHEME = "beamjaxtestfs"


class _ElsewhereFileSystem(LocalFileSystem):
    """A non-local Beam file system for tests: ``beamjaxtestfs:///x`` is the local ``/x``,
    reached only through Beam's ``FileSystems``."""

    opened: list[str] = []

    @classmethod
    def scheme(cls):
        return SCHEME

    @staticmethod
    def _local(path: str) -> str:
        return path.removeprefix(f"{SCHEME}://")

    def join(self, base, *paths):
        return "/".join([base.rstrip("/"), *paths])

    def exists(self, path):
        return super().exists(self._local(path))

    def open(self, path, *args, **kwargs):
        _ElsewhereFileSystem.opened.append(path)
        return super().open(self._local(path), *args, **kwargs)


def test_a_remote_model_directory_is_copied_once_and_embeds_as_the_local_one(tmp_path):
    path = write_tiny_bert(tmp_path / "model", pooling="mean", normalize=True)
    url = f"{SCHEME}://{path}"
    local, remote = SentenceEncoder.from_dir(path), SentenceEncoder.from_dir(url)
    assert remote.path == url and remote.config == local.config
    assert (remote.pooling, remote.normalize) == (local.pooling, local.normalize)

    copy = text.local_model_dir(url)
    assert copy != path and text.local_model_dir(url) is copy  # once per process
    opened = len(_ElsewhereFileSystem.opened)
    assert text.read_model_dir(copy).files == text.read_model_dir(path).files
    assert (copy / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()

    worker = pickle.loads(pickle.dumps(remote))  # as Beam ships it
    ids = [worker.tokenizer().encode(t) for t in sample_texts(3)]
    assert all(np.array_equal(a, local.tokenizer().encode(t))
               for a, t in zip(ids, sample_texts(3), strict=True))  # fmt: skip
    params, expected = worker.load_params(), local.load_params()
    for a in ids:
        lengths = {"L": np.int32(len(a))}
        np.testing.assert_array_equal(
            worker.element_fn(params, {"input_ids": a}, lengths),
            local.element_fn(expected, {"input_ids": a}, lengths),
        )
    assert len(_ElsewhereFileSystem.opened) == opened  # nothing fetched again


def test_a_remote_directory_checked_against_a_manifest_fails_on_a_changed_file(tmp_path):
    path = write_tiny_bert(tmp_path / "model")
    manifest = tmp_path / "manifest.json"
    manifest.write_text(__import__("json").dumps(text.make_manifest(path)))
    (path / "tokenizer.json").write_text((path / "tokenizer.json").read_text() + " ")
    with pytest.raises(text.ModelFileMismatchError, match="tokenizer.json"):
        SentenceEncoder.from_dir(f"{SCHEME}://{path}", manifest=manifest)


def test_a_remote_directory_without_model_files_says_so(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds none of modules.json"):
        text.local_model_dir(f"{SCHEME}://{tmp_path / 'empty'}")


def test_a_local_directory_is_used_in_place(tmp_path):
    assert text.local_model_dir(str(tmp_path)) == tmp_path
