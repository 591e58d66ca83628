"""What bench/embed_text.py's host-only variants put into the job's own process: a trivial
kernel in place of the encoder, clocks on the tokenize step and the garbage collector, and
the tokenize step or the embeddings' Parquet taken away."""

from __future__ import annotations

import os
import threading
import time

DIM = 384


def model_dir() -> str | None:
    """``--model_dir`` (handed to the children in the environment); None: the packaged model."""
    return os.environ.get("BEAM_JAX_BENCH_MODEL_DIR") or None


class Collections:
    """The garbage collector's passes while installed (in ``gc.callbacks``, for the ``with``
    block): full passes (generation 2) counted and timed, younger ones timed."""

    def __init__(self):
        self.full, self.full_s, self.young_s, self._started = 0, 0.0, 0.0, 0.0

    def __enter__(self):
        import gc

        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc):
        import gc

        gc.callbacks.remove(self)

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        if info["generation"] == 2:
            self.full, self.full_s = self.full + 1, self.full_s + seconds
        else:
            self.young_s += seconds


def _in_tokenize_step() -> bool:
    """Whether this thread is the job's tokenize step's (``TokenizeParts``' ``WorkAhead``),
    not the launch plan's, which tokenizes its sample with the same call."""
    from pipelines.embed.tokenize import THREADS

    return threading.current_thread().name.startswith(THREADS)


class FirstPart:
    """When the job first hands a part to its tokenizer (``Tokenizer.encode_arrow`` called
    in the tokenize step's thread, ``beam_jax-tokenize``; the launch plan counts its
    sample's tokens with the same call in the launching thread), while installed: the end
    of the job's launch (flags, model, plan, pipeline built, runner started, first part
    read); and when its tokenizer last returned (``last``): what follows is the parts
    still to embed and write, and the job's end."""

    def __init__(self):
        self.at: float | None = None
        self.at_epoch: float | None = None  # the same moment, for the parent's clock
        self.last: float | None = None

    def __enter__(self):
        from beam_jax.text import Tokenizer

        self._encode = encode = Tokenizer.encode_arrow

        def encode_arrow(tokenizer, texts):
            if not _in_tokenize_step():
                return encode(tokenizer, texts)
            if self.at is None:
                self.at, self.at_epoch = time.perf_counter(), time.time()
            out = encode(tokenizer, texts)
            self.last = time.perf_counter()
            return out

        Tokenizer.encode_arrow = encode_arrow
        return self

    def __exit__(self, *exc):
        from beam_jax.text import Tokenizer

        Tokenizer.encode_arrow = self._encode


def _host_only_kernel(params, element, lengths):
    """384 floats from a text's token ids, at no cost: the sum of its real token ids,
    repeated (the encoder's output shape, no model)."""
    import jax.numpy as jnp

    del params
    ids = element["input_ids"]
    real = jnp.arange(ids.shape[0]) < lengths["L"]
    total = jnp.sum(jnp.where(real, ids, 0)).astype(jnp.float32)
    return jnp.broadcast_to(total, (DIM,))


def _host_only_packed_kernel(params, row, segments):
    """``_host_only_kernel`` for a packed row: each segment's sum of token ids, repeated."""
    import jax.numpy as jnp

    del params
    ids, segment = row["input_ids"], segments.ids  # segment 0: an empty slot
    n = segments.lengths.shape[-1]
    # A one-hot product, not a scatter (slow on CPU): exact, as every sum is below 2**24.
    one_hot = (segment[:, None] == jnp.arange(1, n + 1)[None, :]).astype(jnp.float32)
    totals = ids.astype(jnp.float32) @ one_hot
    return jnp.broadcast_to(totals[:, None], (n, DIM))


def host_only_expected(texts: list[str]):
    """What the host-only variants must write for ``texts``: float32 ``[n, 384]``."""
    import numpy as np

    from beam_jax.text import SentenceEncoder

    sums = [
        int(ids.sum())
        for ids in SentenceEncoder.from_dir(model_dir()).tokenizer().encode_batch(texts)
    ]
    return np.repeat(np.asarray(sums, np.float32)[:, None], DIM, axis=1)


def taken_away(cfg: dict, steps: tuple[str, ...]) -> dict:
    """Takes the host's background ``steps`` away, in this (the variant's own) process.

    ``"tokenize"``: the job's parts (runs of row groups up to ``--rows_per_part`` rows, as
    ``ReadArrowBatches`` reads them) are tokenized now, before the clock, and
    ``Tokenizer.encode_arrow``, called by the tokenize step, returns a part's ids when
    given its texts (checked equal); texts it was not given are tokenized then, counted in
    ``pretokenized_misses`` (the launch plan's sample is tokenized as before).
    ``"vectors"``: each part's Parquet is written with its ``id`` column only.

    Returns the counters, filled in as the job runs.
    """
    counts: dict = {}
    if "tokenize" in steps:
        from beam_jax.text import SentenceEncoder, Tokenizer

        tokenizer = SentenceEncoder.from_dir(cfg["model_dir"]).tokenizer()
        parquet, parts = job_parts(cfg)
        given: dict = {}
        for groups in parts:
            texts = parquet.read_row_groups(groups, columns=["text"]).column("text")
            texts = texts.combine_chunks()
            given[(len(texts), texts[0].as_py(), texts[-1].as_py())] = (
                texts, tokenizer.encode_arrow(texts),
            )  # fmt: skip
        encode = Tokenizer.encode_arrow
        counts.update(tokenizer_calls=0, pretokenized_misses=0)

        def encode_given(self, texts):
            if not _in_tokenize_step():
                return encode(self, texts)  # the launch plan's sample, not a part
            counts["tokenizer_calls"] += 1
            if len(texts):
                hit = given.get((len(texts), texts[0].as_py(), texts[-1].as_py()))
                if hit is not None and hit[0].equals(texts):
                    return hit[1]
            counts["pretokenized_misses"] += 1
            return encode(self, texts)

        Tokenizer.encode_arrow = encode_given
    if "vectors" in steps:
        import types

        import pyarrow.parquet as pq

        from pipelines.embed import write

        def write_ids(table, where, **kwargs):
            pq.write_table(table.select(["id"]), where, **kwargs)

        write.pq = types.SimpleNamespace(**{**vars(pq), "write_table": write_ids})
    return counts


def _no_params():
    return {}


def trivial_encoder():
    """The flagship's ``Encoder`` with the trivial kernels in place of the model's."""
    from pipelines.embed.job import Encoder

    return Encoder(_host_only_kernel, _host_only_packed_kernel, _no_params)


def job_parts(cfg: dict):
    """The data's Parquet file and the job's parts in it: runs of row groups up to
    ``--rows_per_part`` rows, as ``ReadArrowBatches`` reads them."""
    import pyarrow.parquet as pq

    from beam_jax._src.arrow.io import _runs
    from pipelines.embed.flags import parse_args

    args, _ = parse_args(["--runner=FnApiRunner", "--input", cfg["parquet"]] + cfg["pipeline_args"])
    parquet = pq.ParquetFile(cfg["parquet"])
    counts = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
    return parquet, list(_runs(counts, args.rows_per_part))
