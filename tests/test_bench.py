"""bench/run.py runs end to end on a tiny dataset, checks outputs agree and writes its JSON."""

import importlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench_module(name: str):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_bench_runs_every_variant_and_writes_json(tmp_path):
    run = _bench_module("run")
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
        limit = rows["limit"]
        assert limit["ratio_to_limit"] == 1.0
        # Each variant against the read of its own input file.
        for variant, read in run.READ_OF.items():
            r, read_rate = rows[variant], rows[read]["elements_per_s"]
            bound = min(limit["elements_per_s"], read_rate)
            assert r["ratio_to_bound"] == pytest.approx(r["elements_per_s"] / bound)
            serial = 1 / (1 / limit["elements_per_s"] + 1 / read_rate)
            assert r["serial_bound_per_s"] == pytest.approx(serial)
            assert r["ratio_to_serial_bound"] == pytest.approx(r["elements_per_s"] / serial)
            bound = written["serial_bounds"][f"{kernel}/{variant}"]
            assert bound["read"] == read and bound["bound_per_s"] == pytest.approx(serial)
            assert bound["ratio"] == pytest.approx(r["ratio_to_serial_bound"])
            targeted = variant in ("beam_jax_arrow", "beam_jax_arrow_binary")
            assert bound["target"] == (run.SERIAL_TARGET if targeted else None)
            if targeted:
                assert bound["meets_target"] == (bound["ratio"] >= run.SERIAL_TARGET)
            per_record = r["elapsed_s"] / r["elements"] - limit["elapsed_s"] / limit["elements"]
            assert r["host_us_per_record"] == pytest.approx(1e6 * per_record)
            assert 0 < r["mfu"] < 1
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
        ratio = written["ratios"][f"{kernel}/beam_jax_vs_stock_beam_tuned"]
        assert ratio == pytest.approx(
            rows["beam_jax"]["elements_per_s"] / rows["stock_beam_tuned"]["elements_per_s"]
        )


def test_bench_rounds_rotate_and_report_the_median_of_every_round(tmp_path, capsys):
    """With --repeat 3 every variant runs once per round, round r starting at the r-th
    variant; each reports its median run, the spread over its three and every run's time."""
    run = _bench_module("run")
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
    harness = _bench_module("harness")
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
    and prints each serial bound with the variant's ratio to it, and the fingerprint."""
    run = _bench_module("run")
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
    assert set(results["serial_bounds"]) == {"light/beam_jax_arrow", "light/beam_jax_arrow_binary"}
    printed = capsys.readouterr().out
    assert "matmul peak GFLOP/s at 2048^2: fp32" in printed
    for key, bound in results["serial_bounds"].items():
        line = next(ln for ln in printed.splitlines() if ln.strip().startswith(key + " "))
        assert f"{bound['bound_per_s']:.0f}" in line and f"{bound['ratio']:.3f}" in line


def test_bench_variants_launch_as_the_library_jobs_do(monkeypatch):
    """Each variant runs with the objects alive at its start frozen out of the garbage
    collector's passes and Beam's state samplers prompt, as the example pipelines run; both
    are given back when it returns."""
    import gc

    from apache_beam.runners.worker import statesampler

    run = _bench_module("run")
    variants = _bench_module("variants")
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

    kernels = _bench_module("kernels")
    params = kernels.load_params()
    x = {"x": np.zeros((length, kernels.DIM), np.float32)}
    lengths = {"L": np.int32(length)}
    for name, fn in kernels.KERNELS.items():
        cost = jax.jit(fn).lower(params, x, lengths).compile().cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        xla = cost["flops"]
        ours = kernels.model_flops(name, [length])
        # Ours counts matmuls (and pooling adds for light); XLA also counts element-wise
        # work (softmax, gelu, masks), a few percent on top.
        assert ours <= xla <= 1.25 * ours + 2000, (name, ours, xla)


def test_embed_text_bench_measures_the_host_alone(tmp_path):
    """The host-only variants run the flagship end to end, both paths, with the trivial
    kernel in place of the encoder: every row written is that kernel's output."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import builtin_corpus

    embed_text = _bench_module("embed_text")
    out = tmp_path / "bench.json"
    report = embed_text.main(
        ["--variants",
         "host_only,host_only_buckets,tokenize_only,tokenize_only_rust,tokenize_in_beam,"
         "write_only",
         "--texts", "60", "--rounds", "1", "--json", str(out),
         "--keep-outputs", str(tmp_path / "runs")]
    )  # fmt: skip
    variants = json.loads(out.read_text())["variants"]
    assert variants.keys() == {
        "host_only", "host_only_buckets", "tokenize_only", "tokenize_only_rust",
        "tokenize_in_beam", "write_only",
    }  # fmt: skip
    for name in ("host_only", "host_only_buckets"):
        assert variants[name]["sentences_per_s"] > 0 and variants[name]["compiles"] >= 1
        # The garbage collector's passes during the run (young ones always run).
        assert variants[name]["gc_full_passes"] >= 0 and variants[name]["gc_full_s"] >= 0
        assert variants[name]["gc_young_s"] > 0
    for name in ("host_only", "host_only_buckets", "tokenize_in_beam"):
        # The launch ends when the first part reaches the tokenizer, within the run.
        launch = variants[name]["launch_s_median"]
        assert 0 < launch < variants[name]["seconds_median"]
        after = report["after_launch"][name]
        assert after["launch_s"] == launch
        assert after["sentences_per_s"] == pytest.approx(
            60 / (variants[name]["seconds_median"] - launch)
        )
        assert after["vs_tokenize_only"] == pytest.approx(
            after["sentences_per_s"] / variants["tokenize_only"]["sentences_per_s"]
        )
    for name in ("host_only", "host_only_buckets"):
        # The end: from the last part tokenized to the job finished, after the launch.
        end = variants[name]["end_s_median"]
        assert 0 < end < variants[name]["seconds_median"] - variants[name]["launch_s_median"]
        assert report["after_launch"][name]["end_s"] == end
        # The launch from the process's start, imports included, outlasts the one from
        # run() called, and ends within the whole process.
        process_launch = report["after_launch"][name]["process_launch_s"]
        assert variants[name]["launch_s_median"] < process_launch
        assert process_launch < variants[name]["process_s_median"]
    assert report["ratios"]["host_only_vs_host_only_buckets"] > 0
    # The tokenizer alone counted every token of the data; the host is measured against it,
    # and so is the Beam job that only reads and tokenizes (checked against the data too).
    for floor in ("tokenize_only", "tokenize_only_rust", "tokenize_in_beam"):
        tokenize = variants[floor]
        assert tokenize["tokens"] == report["tokens"] and tokenize["sentences_per_s"] > 0
        ratio = report["ratios"][f"host_only_vs_{floor}"]
        assert ratio == pytest.approx(
            tokenize["seconds_median"] / variants["host_only"]["seconds_median"]
        )
    for variant in variants.values():  # no model ran: no model FLOPs
        assert variant["mfu"] is None and variant["flops_per_real_token"] is None
    # The host's CPU during its run bounds what overlap alone could gain: each host-only
    # variant's, against the tokenizer's time.
    threads = report["threads"]
    assert report["ratios"]["tokenize_in_beam_vs_tokenize_only"] == pytest.approx(
        variants["tokenize_only"]["seconds_median"] / variants["tokenize_in_beam"]["seconds_median"]
    )
    assert report["cpu_bounds"].keys() == {"host_only", "host_only_buckets", "tokenize_in_beam"}
    for name, bound in report["cpu_bounds"].items():
        host = variants[name]
        assert 0 < bound["run_cpu_s"] == host["run_cpu_s_median"]
        assert bound["cores_busy"] == pytest.approx(bound["run_cpu_s"] / host["seconds_median"])
        assert bound["all_cores_s"] == pytest.approx(bound["run_cpu_s"] / threads)
        assert bound["vs_tokenize_only"] == pytest.approx(
            variants["tokenize_only"]["seconds_median"] / bound["all_cores_s"]
        )
    # What the job writes, written alone: every row, in the job's schema; the host is
    # measured against tokenizing and then writing.
    written = pa.concat_tables(
        pq.read_table(f) for f in sorted((tmp_path / "runs" / "write_only-0").glob("*.parquet"))
    )
    assert written.column("id").to_pylist() == list(range(60))
    assert written.schema.field("embedding").type == pa.list_(
        pa.field("item", pa.float32(), nullable=False)
    )
    embed_host = _bench_module("embed_host")
    assert len(written.column("embedding")[0]) == embed_host.DIM
    assert report["ratios"]["host_only_vs_tokenize_then_write"] == pytest.approx(
        (variants["tokenize_only"]["seconds_median"] + variants["write_only"]["seconds_median"])
        / variants["host_only"]["seconds_median"]
    )
    texts = [t for _, t in builtin_corpus()][:60]
    expected = embed_host.host_only_expected(texts)
    assert len(set(expected[:, 0].tolist())) > 30  # the texts' outputs differ from each other
    for variant in ("host_only", "host_only_buckets"):
        files = sorted((tmp_path / "runs" / f"{variant}-0").glob("embeddings-*.parquet"))
        table = pa.concat_tables(pq.read_table(f, columns=["id", "embedding"]) for f in files)
        ids = table.column("id").to_numpy()
        got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
        assert sorted(ids.tolist()) == list(range(60)), variant
        np.testing.assert_array_equal(got, expected[ids], err_msg=variant)


def test_embed_text_bench_drops_outputs_nothing_reads(tmp_path):
    """A variant's outputs are deleted once no one reads them: all of them, or all but the
    latest where the cosine reads it."""
    embed_runs = _bench_module("embed_runs")
    runs = []
    for i in range(3):
        (tmp_path / f"run-{i}").mkdir()
        (tmp_path / f"run-{i}" / "part.parquet").write_bytes(b"x")
        runs.append({"out": str(tmp_path / f"run-{i}")})
    embed_runs.drop_outputs(runs, compared=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-2"]
    embed_runs.drop_outputs(runs, compared=False)
    assert list(tmp_path.iterdir()) == []


def test_embed_text_bench_tokenize_in_beam_counts_every_text_and_token(tmp_path):
    """The Beam job that only reads and tokenizes counts the texts and tokens its tokenize
    step put out, and fails when they are not the data's."""
    embed_runs, embed_variants = _bench_module("embed_runs"), _bench_module("embed_variants")
    data = embed_runs.write_data(tmp_path, 2500)  # three row groups of 1,024 rows
    cfg = dict(data, out=str(tmp_path / "out"), pipeline_args=["--rows_per_part", "1024"])
    got = embed_variants.tokenize_in_beam(cfg)  # three parts, a row group each
    assert got["tokens"] == data["tokens"]
    assert 0 < got["launch_s"] < got["seconds"] and got["run_cpu_s"] > 0
    with pytest.raises(AssertionError, match=f"tokenized 2500 texts into {data['tokens']}"):
        embed_variants.tokenize_in_beam(dict(cfg, n=2501))


def test_embed_text_bench_takes_the_host_steps_away_one_at_a_time(tmp_path):
    """The host with its tokenizer's ids given (no part tokenized on the clock, every
    part's ids found), with parts written as ids only, and with both: each runs the whole
    job, and is measured against the tokenizer alone."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from beam_jax.text import builtin_corpus

    embed_text = _bench_module("embed_text")
    n = 2500  # three row groups of the benchmark's 1,024 rows: one part
    taken = ["host_only_pretokenized", "host_only_no_vectors", "host_only_neither"]
    report = embed_text.main(
        ["--variants", ",".join([*taken, "tokenize_only"]), "--texts", str(n), "--rounds", "1",
         "--json", str(tmp_path / "bench.json"), "--keep-outputs", str(tmp_path / "runs")]
    )  # fmt: skip
    variants = report["variants"]
    for name in ("host_only_pretokenized", "host_only_neither"):
        assert variants[name]["tokenizer_calls"] >= 1, name
        assert variants[name]["pretokenized_misses"] == 0, name
    assert "tokenizer_calls" not in variants["host_only_no_vectors"]
    for name in taken:
        ratio = report["ratios"][f"{name}_vs_tokenize_only"]
        assert ratio == pytest.approx(
            variants["tokenize_only"]["seconds_median"] / variants[name]["seconds_median"]
        )
        assert report["cpu_bounds"][name]["run_cpu_s"] == variants[name]["run_cpu_s_median"]
    texts = [t for _, t in builtin_corpus()]
    embed_host = _bench_module("embed_host")
    expected = embed_host.host_only_expected([texts[i % len(texts)] for i in range(n)])
    for name in taken:
        files = sorted((tmp_path / "runs" / f"{name}-0").glob("embeddings-*.parquet"))
        table = pa.concat_tables(pq.read_table(f) for f in files)
        assert sorted(table.column("id").to_pylist()) == list(range(n)), name
        if name == "host_only_pretokenized":  # the given ids are the tokenizer's own
            got = np.stack(table.column("embedding").to_numpy(zero_copy_only=False))
            np.testing.assert_array_equal(got, expected[table.column("id").to_numpy()])
        else:
            assert table.column_names == ["id"], name


def test_packed_stage_bench_runs_each_part_by_the_pack_after_its_own():
    """On the flagship's packing, what a part's pack holds back runs in the next part's
    pack; the last parts run when the bundle ends (no pack follows them)."""
    packed_stage = _bench_module("packed_stage")
    lengths = packed_stage.token_lengths(40_000, seed=3)
    waits, batches = packed_stage.part_waits(lengths, 4096)
    assert waits == [1] * 8 + [None] * 2 and batches > 0


def test_packing_plan_bench_meets_the_padding_target_on_two_real_corpora():
    """Packing pads the built-in corpus and the help topics by at most 5% (empty slots and
    empty rows counted) with at most 4 compiled shapes; planned buckets pad more."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import packing_plan
    finally:
        sys.path.remove(str(ROOT / "bench"))
    report = packing_plan.main(["--buffers", "0,1024", "--budget", "4"])
    assert set(report) == {"built-in corpus", "help topics"}
    for corpus, buffers in report.items():
        for buffer, rows in buffers.items():
            packed = rows["packing, budget 4"]
            assert packed["shapes"] <= 4 and packed["padding"] <= 1.05, (corpus, buffer)
            for label, row in rows.items():
                if label.startswith("buckets"):
                    assert row["padding"] > packed["padding"], (corpus, buffer, label)


def test_embed_text_bench_flop_counts_match_the_encoder():
    """Executed FLOPs per token slot agree with XLA's count of the real encoder at one
    length (XLA also counts norms, softmax and gelu: a few percent on top); a batch's
    slots at each length add up."""
    import jax
    import numpy as np

    from beam_jax.text import SentenceEncoder

    embed_report = _bench_module("embed_report")
    length = 32
    encoder = SentenceEncoder.from_dir()
    params = encoder.load_params()
    element = {"input_ids": np.full((length,), 1000, np.int32)}
    cost = jax.jit(encoder.element_fn).lower(params, element, {"L": np.int32(length)})
    cost = cost.compile().cost_analysis()
    xla = (cost[0] if isinstance(cost, list) else cost)["flops"]
    ours = length * embed_report.flops_per_token(length)
    assert ours <= xla <= 1.1 * ours, (ours, xla)
    slots = {"32": 64 * 32, "128": 2 * 128}
    assert embed_report.executed_flops(slots) == pytest.approx(
        64 * 32 * embed_report.flops_per_token(32) + 2 * 128 * embed_report.flops_per_token(128)
    )


def test_embed_text_bench_models_sentence_transformers_batching():
    """Texts sorted longest first by characters, batches padded to their longest in tokens."""
    embed_report = _bench_module("embed_report")
    texts = ["a", "bbbbbb", "cc", "dddd", "eee"]
    tokens = [3, 9, 4, 5, 7]
    # By characters: bbbbbb (9), dddd (5), eee (7) | cc (4), a (3)
    assert embed_report.st_slots_by_length(texts, tokens, 3) == {"9": 27, "4": 8}
    assert embed_report.st_slots_by_length(texts, tokens, 64) == {"9": 45}


def test_embed_text_bench_runs_sentence_transformers_on_the_device_asked_for(tmp_path):
    """--st-device reaches the interpreter that runs sentence-transformers, which loads the
    model onto it and reports the device (here stand-ins for torch and sentence-transformers
    on that interpreter's path: no torch in the project's own install)."""
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text(
        "__version__ = 'stand-in'\nbfloat16 = 'bf16'\nAUTOCAST = []\n"
        "def set_num_threads(n):\n    pass\n"
        "class autocast:\n"
        "    def __init__(self, kind, dtype):\n        self.args = (kind, dtype)\n"
        "    def __enter__(self):\n        AUTOCAST.append(self.args)\n"
    )
    (fake / "sentence_transformers").mkdir()
    (fake / "sentence_transformers" / "__init__.py").write_text(
        "import numpy as np\n"
        "class SentenceTransformer:\n"
        "    def __init__(self, path, device):\n"
        "        self.device = device\n"
        "    def encode(self, texts, batch_size, convert_to_numpy):\n"
        "        import torch\n"
        "        scale = 2.0 if torch.AUTOCAST else 1.0  # shows the autocast was entered\n"
        "        return np.array([[len(t) * scale] * 384 for t in texts], np.float32)\n"
    )
    python = tmp_path / "st-python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={fake}:$PYTHONPATH exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    embed_text = _bench_module("embed_text")
    report = embed_text.main(
        ["--variants", "sentence_transformers,sentence_transformers_bf16", "--texts", "20",
         "--rounds", "1", "--st-python", str(python), "--st-device", "cuda:7",
         "--keep-outputs", str(tmp_path / "runs")]
    )  # fmt: skip
    st = report["variants"]["sentence_transformers"]
    assert st["device"] == "cuda:7" and st["torch"] == "stand-in"
    assert st["sentences_per_s"] > 0
    # The whole process is timed too, and outlasts encode alone.
    assert st["process_s_median"] > st["seconds_median"] > 0
    assert st["st_dtype"] == "float32"
    assert report["variants"]["sentence_transformers_bf16"]["st_dtype"] == "bfloat16"
    import numpy as np

    plain = np.load(tmp_path / "runs" / "sentence_transformers-0" / "vectors.npy")
    autocast = np.load(tmp_path / "runs" / "sentence_transformers_bf16-0" / "vectors.npy")
    np.testing.assert_array_equal(autocast, 2 * plain)  # the stand-in's mark of autocast


def test_embed_text_bench_sets_the_flagship_against_sentence_transformers_at_one_precision():
    embed_report = _bench_module("embed_report")

    def row(process, steady):
        return {"process_s_median": process, "seconds_median": steady}

    results = {
        "pipeline_float32": row(10.0, 4.0),
        "sentence_transformers": row(15.0, 8.0),
        "pipeline": row(8.0, 2.0),
        "sentence_transformers_bf16": row(12.0, 3.0),
        "runinference": row(1.0, 1.0),
    }
    got = embed_report.same_precision_ratios(results)
    assert got == {
        "pipeline_float32_vs_sentence_transformers":
            {"precision": "float32", "process": 1.5, "steady": 2.0},
        "pipeline_vs_sentence_transformers_bf16":
            {"precision": "bfloat16", "process": 1.5, "steady": 1.5},
    }  # fmt: skip
    del results["sentence_transformers_bf16"]  # a pair with one side missing is left out
    assert list(embed_report.same_precision_ratios(results)) == [
        "pipeline_float32_vs_sentence_transformers"
    ]


def test_embed_text_bench_sets_the_flagship_against_the_encoders_limit(tmp_path):
    """--limit_json: pipeline's warm median rate (rounds after the first) over the limit
    that bench/encoder.py --flagship --json wrote; no figure without a warm round, and a
    file without the limit refused before anything runs."""
    embed_text, embed_report = _bench_module("embed_text"), _bench_module("embed_report")
    path = tmp_path / "encoder.json"
    path.write_text(
        json.dumps({"flagship_limit": {"texts_per_s": 500.0, "texts": 2000, "seconds": 4.0}})
    )
    limit = embed_report.read_limit(str(path))
    runs = {"pipeline": [{"seconds": 10.0}, {"seconds": 4.0}, {"seconds": 5.0}]}
    cold_warm = embed_report.cold_warm(runs, {"pipeline": {"seconds_median": 5.0}})
    assert cold_warm == {"pipeline_cold_s": 10.0, "pipeline_warm_s": 4.5}
    ratio = embed_report.pipeline_vs_limit(limit, 2000, cold_warm)
    assert ratio == pytest.approx(2000 / 4.5 / 500.0)
    assert embed_text.limit_line(ratio, limit, 2000) == (
        "pipeline vs encoder limit: 0.89x (warm median)"
    )
    assert embed_text.limit_line(ratio, limit, 300).endswith(
        "; the limit was measured on 2000 texts, pipeline on 300"
    )
    one_round = embed_report.cold_warm({"pipeline": runs["pipeline"][:1]}, {})
    assert embed_report.pipeline_vs_limit(limit, 2000, one_round) is None
    assert "no warm round" in embed_text.limit_line(None, limit, 2000)
    path.write_text(json.dumps({"rows": {}}))
    with pytest.raises(ValueError, match=r"no flagship_limit .*found \['rows'\]"):
        embed_text.main(["--limit_json", str(path), "--variants", "tokenize_only"])


def test_embed_text_bench_stops_a_run_past_its_timeout_and_says_where_it_was():
    """A run that outlasts --timeout is stopped with its threads' stacks in the error, so a
    run that stalls (on a machine one cannot log into afterwards) is diagnosed from its
    output. A child starting Python, JAX and Beam takes well over 0.3 s."""
    embed_text = _bench_module("embed_text")
    with pytest.raises(RuntimeError, match=r"tokenize_only \(round 1\) ran past --timeout 0.3 s"
                       ) as stopped:  # fmt: skip
        embed_text.main(
            ["--variants", "tokenize_only", "--texts", "20", "--rounds", "1", "--timeout", "0.3"]
        )
    assert "(most recent call first)" in str(stopped.value)


def test_embed_text_bench_runs_the_flagship_packed_and_bucketed(tmp_path):
    """Both batchings and float32 matmuls run end to end side by side; each reports the
    dtype its dense matmuls ran in, its executed FLOPs per real token and MFU (against that
    dtype's peak), and packed is compared with buckets."""
    embed_text, embed_report = _bench_module("embed_text"), _bench_module("embed_report")
    report = embed_text.main(
        ["--variants", "pipeline_packed,pipeline_buckets,pipeline_float32", "--texts", "60",
         "--rounds", "1"]
    )  # fmt: skip
    assert report["variants"]["pipeline_float32"]["matmuls"] == "float32"
    for name in ("pipeline_packed", "pipeline_buckets", "pipeline_float32"):
        variant = report["variants"][name]
        assert variant["matmuls"] in ("float32", "bfloat16")
        assert variant["compiles"] >= 1 and 0 < variant["mfu"] < 1
        # Every real token costs at least the dense layers; padding and attention add.
        assert variant["flops_per_real_token"] > embed_report.flops_per_token(1)
        assert sum(variant["slots_by_length"].values()) >= report["tokens"]
    packed, buckets = report["variants"]["pipeline_packed"], report["variants"]["pipeline_buckets"]
    assert report["ratios"]["pipeline_packed_vs_pipeline_buckets"] == pytest.approx(
        buckets["seconds_median"] / packed["seconds_median"]
    )


def test_host_threads_bench_times_each_step_alone_and_beside_python(tmp_path):
    """Every step runs alone and beside a Python-busy thread at both switch intervals; the
    slowdowns are against the step alone, and the switch interval is restored."""
    host_threads = _bench_module("host_threads")
    before = sys.getswitchinterval()
    out = tmp_path / "threads.json"
    report = host_threads.main(["--texts", "3000", "--rounds", "1", "--json", str(out)])
    assert sys.getswitchinterval() == before
    assert json.loads(out.read_text())["steps"].keys() == {
        "tokenize_numpy", "tokenize_rust", "write_filesystems", "write_native"
    }  # fmt: skip
    settings = [s for s, _ in host_threads.SETTINGS]
    for name, step in report["steps"].items():
        assert step["items"] == (3000 if name.startswith("tokenize") else host_threads.PART)
        assert step["alone"]["slowdown"] == 1.0
        for setting in settings:
            timed = step[setting]
            assert timed["wall_s"] > 0 and timed["thread_cpu_s"] >= 0
            assert timed["slowdown"] == pytest.approx(timed["wall_s"] / step["alone"]["wall_s"])


def test_host_cores_bench_sets_one_core_against_two_and_a_baseline(tmp_path, monkeypatch):
    """Each checkout's host_only on one core and on two, the ratio of their medians, and no
    lock figures when py-spy is left out."""
    host_cores = _bench_module("host_cores")
    monkeypatch.setattr(host_cores.os, "sched_getaffinity", lambda _: {0, 1})
    out = tmp_path / "cores.json"
    report = host_cores.main([
        "--texts", "300", "--rounds", "1", "--no-gil", "--baseline", str(ROOT),
        "--json", str(out),
    ])  # fmt: skip
    assert json.loads(out.read_text())["ratios"] == report["ratios"]
    results = report["results"]
    assert set(results) == {f"{t} {c} cores" for t in ("baseline", "this tree") for c in (1, 2)}
    for tree in ("baseline", "this tree"):
        one, two = results[f"{tree} 1 cores"], results[f"{tree} 2 cores"]
        assert report["ratios"][tree] == pytest.approx(
            one["seconds_median"] / two["seconds_median"]
        )
        assert 0 < one["launch_s_median"] < one["seconds_median"]
        assert one["process_launch_s_median"] > one["launch_s_median"]
        assert "gil_us_per_text" not in one


def test_peak_prints_the_size_it_measured_at_and_the_fingerprint_keeps_it(capsys):
    peak = _bench_module("peak")
    out = peak.main(["--sizes", "128,256", "--repeat", "1", "--calls", "3"])
    assert out["sizes"] == [128, 256] and set(out["by_size"]["fp32"]) == {128, 256}
    assert out["peak_gflops"]["fp32"] == max(out["by_size"]["fp32"].values()) > 0
    best = max(out["by_size"]["fp32"], key=out["by_size"]["fp32"].get)
    assert out["fingerprint"]["peak_size"] >= best
    assert f"at {out['fingerprint']['peak_size']}^2" in capsys.readouterr().out
    assert peak.default_size() == 2048  # on a CPU; 8,192 on an accelerator


def test_bench_data_writes_only_the_files_asked_for_with_the_same_values(tmp_path):
    import numpy as np
    import pyarrow.parquet as pq

    data = _bench_module("data")
    meta = data.generate(tmp_path, 50, 3, ("values.f32",))
    assert not (tmp_path / "data.parquet").exists()
    assert data.generate(tmp_path, 50, 3, data.FILES) == meta  # the other two added
    reader = data.RecordReader(str(tmp_path))
    table = pq.read_table(tmp_path / "data.parquet")
    binary = pq.read_table(tmp_path / "data_binary.parquet")
    lengths = np.load(tmp_path / "lengths.npy")
    for i in (0, 17, 49):
        x = reader.read(i)
        assert x.shape == (lengths[i], data.DIM)
        np.testing.assert_array_equal(
            np.asarray(table.column("x")[i].as_py(), np.float32), x.ravel()
        )
        np.testing.assert_array_equal(
            np.frombuffer(binary.column("x")[i].as_py(), np.float32), x.ravel()
        )
    reader.close()
    with pytest.raises(ValueError, match="unknown data files"):
        data.generate(tmp_path, 50, 3, ("values.csv",))


def test_embed_text_bench_runs_another_model_directory(tmp_path, monkeypatch):
    """``--model_dir``: the flagship runs that model (its hidden size sets the FLOPs per
    token), and the children are told which model through the environment."""
    from tests.tiny_families import write_tiny_mpnet

    model = write_tiny_mpnet(tmp_path / "mpnet")
    monkeypatch.setenv("BEAM_JAX_BENCH_MODEL_DIR", "")  # restored (unset) after the test
    embed_text, embed_report = _bench_module("embed_text"), _bench_module("embed_report")
    embed_report._encoder.cache_clear()  # an earlier test's model
    try:
        report = embed_text.main(
            ["--model_dir", str(model), "--variants", "pipeline", "--texts", "30", "--rounds", "1"]
        )
    finally:
        embed_report._encoder.cache_clear()  # the model of this process's later bench tests
    from beam_jax.text import SentenceEncoder

    tiny, minilm = SentenceEncoder.from_dir(str(model)), SentenceEncoder.from_dir()
    variant = report["variants"]["pipeline"]
    assert variant["compiles"] >= 1
    # Counted with the tiny model's widths, not MiniLM's (whose dense layers alone cost more).
    assert tiny.flops_per_token(1) <= variant["flops_per_real_token"]
    assert variant["flops_per_real_token"] < minilm.flops_per_token(1) / 10
