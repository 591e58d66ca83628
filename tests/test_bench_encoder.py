"""bench/encoder.py: its packing and buckets hold every text once, and its JAX variants
agree with each other end to end on a few texts."""

import importlib
import sys
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parent.parent


def _bench_module(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 256), min_size=1, max_size=60), st.sampled_from([64, 128, 256]))
def test_packed_rows_hold_every_text_once_within_their_width(lengths, row_length):
    encoder = _bench_module("encoder")
    lengths = np.array(lengths)
    rows = encoder.pack_rows(lengths, row_length, 256)
    placed = sorted(i for _, members in rows for i in members)
    assert placed == list(range(len(lengths)))
    for width, members in rows:
        assert width in (row_length, 256)
        assert sum(lengths[members]) <= width
        assert width == 256 or max(lengths[members]) <= row_length


def test_packed_and_bucketed_batches_carry_each_texts_tokens():
    encoder = _bench_module("encoder")
    rng = np.random.default_rng(0)
    ids = [rng.integers(1, 1000, n).astype(np.int32) for n in (3, 130, 17, 256, 40, 9, 9)]
    seen = {}
    for tok, seg, pos, counts, _, texts in encoder.packed_batches(ids, 128, 2, 256):
        for r, members in enumerate(texts):
            assert counts[r] == len(members)
            for s, i in enumerate(members):
                at = seg[r] == s + 1
                np.testing.assert_array_equal(tok[r][at], ids[i])
                np.testing.assert_array_equal(pos[r][at], np.arange(len(ids[i])))
                seen[i] = seen.get(i, 0) + 1
    assert seen == dict.fromkeys(range(len(ids)), 1)
    rows = {}
    for tok, lengths, chunk in encoder.bucket_batches(ids):
        assert tok.shape[1] in encoder.BUCKETS
        for r, i in enumerate(chunk):
            assert lengths[r] == len(ids[i])
            np.testing.assert_array_equal(tok[r, : lengths[r]], ids[i])
            rows[i] = tok.shape[1]
    assert rows == {0: 16, 1: 192, 2: 24, 3: 256, 4: 48, 5: 16, 6: 16}


def test_jax_variants_give_the_same_vectors():
    encoder = _bench_module("encoder")
    from beam_jax.text import SentenceEncoder

    model = SentenceEncoder.from_dir(max_length=64)
    texts = ["A cat sat on the mat.", "Packing rows of text", "x " * 80, "short"]
    ids = model.tokenizer().encode_batch(texts)
    variants = encoder.JaxVariants(ids, [32], [2], model)
    buckets = {next(b for b in encoder.BUCKETS if b >= len(x)) for x in ids}
    assert variants.compile_all()["bucketed"]["shapes"] == len(buckets)
    _, packed = variants.run("packed 32 x2")
    _, bucketed = variants.run("bucketed")
    np.testing.assert_allclose(np.sum(packed * bucketed, axis=1), 1.0, atol=1e-5)


def test_the_flagships_batches_beside_a_busy_host_give_its_vectors(monkeypatch):
    encoder = _bench_module("encoder")
    from beam_jax.text import SentenceEncoder

    model = SentenceEncoder.from_dir(max_length=64)
    texts = ["A cat sat on the mat.", "Packing rows of text", "x " * 80, "short"] * 3
    ids = model.tokenizer().encode_batch(texts)
    plan = {"row_lengths": [32, 64], "rows_per_batch": {"32": [2], "64": [2]},
            "max_segments": 4, "algorithm": "first_fit_decreasing", "pack_lengths": [32, 64],
            "buffer_size": 8192}  # fmt: skip
    calls = []
    tokenizer = model.tokenizer()
    encode = type(tokenizer).encode_arrow
    monkeypatch.setattr(type(tokenizer), "encode_arrow", lambda *a: calls.append(1) or encode(*a))
    variants = encoder.JaxVariants(ids, [], [], model, plan, busy=(2, texts))

    assert set(variants.variants) == {"flagship", *encoder.BUSY}
    variants.compile_all()
    _, alone = variants.run("flagship")
    before = len(calls)
    _, tokenizing = variants.run("flagship, tokenizing")
    _, writing = variants.run("flagship, writing")

    assert len(calls) > before  # the threads tokenized while the batches ran
    np.testing.assert_allclose(tokenizing, alone, atol=1e-6)
    np.testing.assert_allclose(writing, alone, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(alone, axis=1), 1.0, atol=1e-5)
