"""Model directories on any Beam file system, copied to local disk once per process."""

from __future__ import annotations

import functools
import pathlib
import posixpath
import tempfile

from beam_jax._src.files import copy_to_local
from beam_jax._src.text import model_dir as md

__all__ = ["is_remote", "local_model_dir"]

# What read_model_dir and the weights may read, relative to the Transformer module.
_TRANSFORMER_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "sentence_bert_config.json",
    "tokenizer_config.json",
)


def is_remote(path: str | pathlib.Path) -> bool:
    """Whether ``path`` names a directory on a Beam file system other than the local one
    (``gs://``, ``s3://`` ...)."""
    return "://" in str(path)


@functools.cache
def local_model_dir(path: str) -> pathlib.Path:
    """A local directory holding the model files of ``path``: ``path`` itself when local,
    else a copy made once per process of the files a sentence encoder reads
    (``modules.json``, the Transformer module's configs, tokenizer and weights, the Pooling
    module's config).

    Example:
        >>> local_model_dir("/models/minilm")
        PosixPath('/models/minilm')

    Args:
        path: A local directory, or one on any Beam file system (``gs://bucket/model``).

    Raises:
        FileNotFoundError: ``path`` holds none of the model files.
        SpecError: Its ``modules.json`` describes modules this encoder does not implement.
    """
    if not is_remote(path):
        return pathlib.Path(path)
    local = pathlib.Path(tempfile.mkdtemp(prefix="beam_jax-model-"))
    fetched = copy_to_local(path, ["modules.json"], local)
    transformer, pooling = (p for _, p in md._modules(local)[:2])
    names = [posixpath.join(transformer, name) for name in _TRANSFORMER_FILES]
    if pooling != transformer:
        names.append(posixpath.join(pooling, "config.json"))
    fetched += copy_to_local(path, names, local)
    if not fetched:
        raise FileNotFoundError(
            f"model directory {path} holds none of modules.json, "
            f"{', '.join(_TRANSFORMER_FILES)}; expected a sentence-transformers model directory"
        )
    return local
