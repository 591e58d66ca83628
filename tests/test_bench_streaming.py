"""``bench/streaming.py``: small bundles in bundle mode, cross-bundle mode and one large
bundle, on the direct runner (through ``beam_jax.testing.StreamTest``) and the FnApiRunner."""

from bench import streaming


def test_cross_bundle_mode_fills_the_batches_small_bundles_leave_empty(capsys):
    results = streaming.main(
        ["--elements", "60", "--batch-size", "8", "--num-buckets", "2", "--max-wait-s", "60",
         "--repeat", "1", "--modes", "large_bundle,small_bundle,cross_bundle,fnapi_small,"
         "fnapi_small_cross"]
    )  # fmt: skip
    for small, cross in (("small_bundle", "cross_bundle"), ("fnapi_small", "fnapi_small_cross")):
        assert results[cross]["batch_fill"] > results[small]["batch_fill"], (small, cross)
        assert results[cross]["batches"] < results[small]["batches"], (small, cross)
        assert sum(results[cross]["flushes"].values()) == results[cross]["batches"]
        assert results[small]["flushes"] == {} and results[small]["wait_p99_ms"] is None
    # Every bundle is counted on the direct runner: one large bundle's batches, not fewer.
    assert results["cross_bundle"]["batches"] == results["large_bundle"]["batches"]
    out = capsys.readouterr().out
    assert "heavy kernel on cpu (" in out and "  cross_bundle: " in out  # as it goes
    assert "x large" in out and "matmul peak" in out
