"""bench/run.py runs end to end on a tiny dataset, checks outputs agree and writes its JSON;
what it shares with the other benchmarks (bench/_lib) does what it says."""

import json
import sys

import pytest

from bench import run
from bench._lib import harness, machine, records, variants


def test_bench_runs_every_variant_and_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    results = run.main(
        [
            "--elements", "120",
            "--num-buckets", "3",
            "--in-process",
            "--repeat", "1",
            "--workdir", str(tmp_path / "data"),
            "--batch-size", "16",
            "--max-padded-size", "8192",
            "--json", str(out),
        ]
    )  # fmt: skip
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(results))
    assert written["fingerprint"]["peak_gflops"]["fp32"] > 0
    assert set(written["results"]) == {"heavy", "light"}
    for kernel, rows in written["results"].items():
        assert set(rows) == set(run.VARIANT_NAMES), kernel
        for variant, row in rows.items():
            for field in ("elements_per_s", "ratio_to_limit", "ratio_to_bound", "spread"):
                assert isinstance(row[field], int | float), (kernel, variant, field)
            assert row["elements_per_s"] > 0
            assert row["repeats"] == 1
            assert row["device"].startswith("cpu ("), (kernel, variant)  # the device it timed
        limit = rows["limit"]
        assert limit["ratio_to_limit"] == 1.0
        # Each variant against the read of its own input file.
        for variant, read in run.READ_OF.items():
            if read is None:
                continue
            r, read_rate = rows[variant], rows[read]["elements_per_s"]
            bound = min(limit["elements_per_s"], read_rate)
            assert r["ratio_to_bound"] == pytest.approx(r["elements_per_s"] / bound)
            serial = 1 / (1 / limit["elements_per_s"] + 1 / read_rate)
            assert r["serial_bound_per_s"] == pytest.approx(serial)
            assert r["ratio_to_serial_bound"] == pytest.approx(r["elements_per_s"] / serial)
            per_record = r["elapsed_s"] / r["elements"] - limit["elapsed_s"] / limit["elements"]
            assert r["host_us_per_record"] == pytest.approx(1e6 * per_record)
            assert 0 < r["mfu"] < 1
            assert r["check"].startswith("max |diff|")  # checked against the limit's
        # beam_jax compiles only listed shapes: one batch size per bucket here; so does the
        # tuned stock baseline (one batch size, lengths padded to the buckets).
        assert rows["beam_jax"]["compiles"] <= 3
        assert rows["beam_jax_arrow"]["compiles"] == rows["beam_jax"]["compiles"]
        assert rows["stock_beam_tuned"]["compiles"] <= 3
        assert rows["stock_runinference_tuned"]["compiles"] <= 3
        assert rows["stock_beam_buckets"]["compiles"] <= 3
        # The limit's compiles happen before its clock and are reported beside it.
        assert limit["compiles"] <= 3 and limit["compile_s"] > 0
        # Every variant against the fastest stock variant of the same run.
        peer = written["strongest_stock"][kernel]
        assert peer == max(run.STOCK, key=lambda v: rows[v]["elements_per_s"])
        for variant, row in rows.items():
            assert row["elements"] == 120, variant  # every variant on the same records
            assert row["ratio_to_stock"] == pytest.approx(
                row["elements_per_s"] / rows[peer]["elements_per_s"]
            )
            assert row["cpu_us_per_record"] == pytest.approx(1e6 * row["cpu_s"] / 120)
            assert row["cores_busy"] > 0
        # Every length-bucketed variant batches one bucket's records together: it pads no
        # more than the limit, which pads the same buckets and every batch to full rows. A
        # baseline whose length function breaks (Beam 2.78 hands RunInference's
        # batch_length_fn the example, not the (key, example) pair) puts all lengths in
        # one bucket and pads far more, or fails on a record of length 1.
        for variant in run.LENGTH_BUCKETED:
            padding = rows[variant]["padding_ratio"]
            assert 1 <= padding <= rows["limit"]["padding_ratio"] + 1e-9, (kernel, variant)
        ratio = written["ratios"][f"{kernel}/beam_jax_vs_{peer}"]
        assert ratio == pytest.approx(
            rows["beam_jax"]["elements_per_s"] / rows[peer]["elements_per_s"]
        )


def test_bench_rounds_rotate_and_report_the_median_of_every_round(tmp_path, capsys):
    """With --repeat 3 every variant runs once per round, round r starting at the r-th
    variant; each reports its median run, the spread over its three and every run's time."""
    results = run.main(
        ["--elements", "40", "--kernels", "light", "--num-buckets", "2", "--in-process",
         "--repeat", "3", "--workdir", str(tmp_path / "data"), "--batch-size", "16",
         "--variants", "read_only_raw,read_only"]
    )  # fmt: skip
    names = ["limit", "read_only_raw", "read_only"]
    expected = [names, names[1:] + names[:1], names[2:] + names[:2]]
    assert results["orders"]["light"] == expected
    # The order printed as they ran is the rotated one.
    ran = [
        ln.strip().split(":")[0].split("/")[1]
        for ln in capsys.readouterr().out.splitlines()
        if ln.startswith("  light/")
    ]
    assert ran == [v for order in expected for v in order]
    for variant, row in results["results"]["light"].items():
        times = row["runs_s"]
        assert row["repeats"] == len(times) == 3, variant
        assert row["elapsed_s"] == sorted(times)[1], variant
        assert row["spread"] == pytest.approx((max(times) - min(times)) / row["elapsed_s"])
        assert row["elements_per_s"] == pytest.approx(40 / row["elapsed_s"])


def test_bench_harness_rotates_rounds_and_takes_medians():
    seen = []
    runs, orders = harness.run_rounds(
        ["a", "b", "c", "d"], 5, lambda name, r: seen.append((r, name)) or {"elapsed_s": r}
    )
    assert orders == [
        ["a", "b", "c", "d"], ["b", "c", "d", "a"], ["c", "d", "a", "b"],
        ["d", "a", "b", "c"], ["a", "b", "c", "d"],
    ]  # fmt: skip
    assert seen == [(r, name) for r, order in enumerate(orders) for name in order]
    s = harness.summarize([{"elapsed_s": t, "peak_rss_mb": m} for t, m in [(3, 1), (1, 5), (2, 2)]])
    assert (s["elapsed_s"], s["peak_rss_mb"], s["repeats"]) == (2, 5, 3)
    assert s["spread"] == pytest.approx(1.0) and s["runs_s"] == [3, 1, 2]
    even = harness.summarize([{"elapsed_s": t} for t in (4, 1, 3, 2)])
    assert even["elapsed_s"] == 3  # the slower middle run of an even count
    with pytest.raises(ValueError, match="repeat must be at least 1"):
        harness.run_rounds(["a"], 0, lambda name, r: {})


def test_bench_runs_each_variant_with_its_bounds(tmp_path, capsys):
    """Asked for the Arrow variants alone, the run adds the limit and each one's own read,
    and prints each variant's ratio to its serial bound, the device and the fingerprint."""
    results = run.main(
        ["--elements", "60", "--kernels", "light", "--num-buckets", "2", "--in-process",
         "--repeat", "1", "--workdir", str(tmp_path / "data"), "--batch-size", "16",
         "--variants", "beam_jax_arrow_binary,beam_jax_arrow"]
    )  # fmt: skip
    rows = results["results"]["light"]
    assert list(rows) == [
        "limit",
        "read_only_binary",
        "read_only",
        "beam_jax_arrow_binary",
        "beam_jax_arrow",
    ]
    printed = capsys.readouterr().out
    assert "matmul peak GFLOP/s at 2048^2: fp32" in printed and "timed on cpu (" in printed
    for variant in ("beam_jax_arrow", "beam_jax_arrow_binary"):
        line = next(ln for ln in printed.splitlines() if ln.startswith(f"light   {variant} "))
        assert f"{rows[variant]['ratio_to_serial_bound']:.3f}" in line, line
    assert results["strongest_stock"] == {"light": None}  # no stock variant ran


def test_bench_variants_launch_as_the_library_jobs_do(monkeypatch):
    """Each variant runs with the objects alive at its start frozen out of the garbage
    collector's passes and Beam's state samplers prompt, as the example pipelines run; both
    are given back when it returns."""
    import gc

    from apache_beam.runners.worker import statesampler

    seen = {}

    def probe(kernel, cfg):
        seen.update(
            kernel=kernel,
            cfg=cfg,
            frozen=gc.get_freeze_count(),
            period=statesampler.StateSampler("stage", None).sampling_period_ms,
        )
        return {"elapsed_s": 1.0}

    monkeypatch.setitem(variants.VARIANTS, "probe", probe)
    assert gc.get_freeze_count() == 0
    assert run._variant("light", "probe", {"n": 3}) == {"elapsed_s": 1.0}
    assert seen["kernel"] == "light" and seen["cfg"] == {"n": 3}
    assert seen["frozen"] > 0
    assert seen["period"] == 10
    assert gc.get_freeze_count() == 0
    assert statesampler.StateSampler("stage", None).sampling_period_ms == 200


@pytest.mark.parametrize("length", [1, 7, 64])
def test_bench_model_flops_match_xla_cost_analysis(length):
    """The MFU column's FLOP counts agree with XLA's count of the unpadded kernel."""
    import jax
    import numpy as np

    params = records.load_params()
    x = {"x": np.zeros((length, records.DIM), np.float32)}
    lengths = {"L": np.int32(length)}
    for name, fn in records.KERNELS.items():
        cost = jax.jit(fn).lower(params, x, lengths).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla = cost["flops"]
        ours = records.model_flops(name, [length])
        # Ours counts matmuls (and pooling adds for light); XLA also counts element-wise
        # work (softmax, gelu, masks), a few percent on top.
        assert ours <= xla <= 1.25 * ours + 2000, (name, ours, xla)


def test_the_peak_prints_the_size_it_measured_at_and_the_fingerprint_keeps_it(capsys):
    out = machine.main(["--sizes", "128,256", "--repeat", "1", "--calls", "3"])
    assert out["sizes"] == [128, 256] and set(out["by_size"]["fp32"]) == {128, 256}
    assert out["peak_gflops"]["fp32"] == max(out["by_size"]["fp32"].values()) > 0
    # One size is printed for every dtype: the largest of the sizes each dtype peaked at
    # (on a busy CPU float32 may peak at 128 and bfloat16 at 256).
    best = max(max(rates, key=rates.get) for rates in out["by_size"].values())
    assert out["fingerprint"]["peak_size"] == best
    printed = capsys.readouterr().out
    assert f"at {best}^2" in printed
    # The device it measured and the environment's XLA settings are printed with it.
    assert "jax 0" in printed and " cpu (" in printed and "XLA environment:" in printed
    assert machine.default_size() == 2048  # on a CPU; 8,192 on an accelerator


def test_bench_data_writes_only_the_files_asked_for_with_the_same_values(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    meta = records.generate(tmp_path, 50, 3, ("values.f32",))
    assert not (tmp_path / "data.parquet").exists()
    assert records.generate(tmp_path, 50, 3, records.FILES) == meta  # the other two added
    reader = records.RecordReader(str(tmp_path))
    table = pq.read_table(tmp_path / "data.parquet")
    binary = pq.read_table(tmp_path / "data_binary.parquet")
    lengths = np.load(tmp_path / "lengths.npy")
    for i in (0, 17, 49):
        x = reader.read(i)
        assert x.shape == (lengths[i], records.DIM)
        np.testing.assert_array_equal(
            np.asarray(table.column("x")[i].as_py(), np.float32), x.ravel()
        )
        np.testing.assert_array_equal(
            np.frombuffer(binary.column("x")[i].as_py(), np.float32), x.ravel()
        )
    reader.close()
    with pytest.raises(ValueError, match="unknown data files"):
        records.generate(tmp_path, 50, 3, ("values.csv",))


def test_a_child_prints_as_it_runs_and_one_past_its_timeout_says_where_it_was(capsys):
    code = "import json; print('working', flush=True); print('RESULT ' + json.dumps({'x': 1}))"
    assert harness.run_child([sys.executable, "-c", code], timeout=60) == {"x": 1}
    assert "    | working" in capsys.readouterr().out
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(RuntimeError, match="slow ran past its timeout of 2 s") as stopped:
        harness.run_child(sleep, timeout=2, what="slow")
    assert "(most recent call first)" in str(stopped.value)
    with pytest.raises(RuntimeError, match=r"failed \(exit 3\)"):
        harness.run_child([sys.executable, "-c", "raise SystemExit(3)"], timeout=60)
