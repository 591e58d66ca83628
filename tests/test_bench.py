"""bench/run.py runs end to end on a tiny dataset, checks outputs agree and writes its JSON."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_runs_every_variant_and_writes_json(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import run
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "bench.json"
    results = run.main(
        [
            "--elements", "120",
            "--num-buckets", "3",
            "--in-process",
            "--workdir", str(tmp_path / "data"),
            "--batch-size", "16",
            "--max-padded-size", "8192",
            "--json", str(out),
        ]
    )  # fmt: skip
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(results))
    assert set(written) == {"heavy", "light"}
    for kernel, rows in written.items():
        assert set(rows) == set(run.VARIANT_NAMES), kernel
        for variant, row in rows.items():
            for field in run.FIELDS:
                assert isinstance(row[field], int | float), (kernel, variant, field)
            assert row["elements_per_s"] > 0
        assert rows["limit"]["ratio_to_limit"] == 1.0
        bound = min(rows["limit"]["elements_per_s"], rows["read_only"]["elements_per_s"])
        assert rows["beam_jax"]["ratio_to_bound"] == rows["beam_jax"]["elements_per_s"] / bound
        # beam_jax compiles only listed shapes: one batch size per bucket here.
        assert rows["beam_jax"]["compiles"] <= 3
        assert rows["beam_jax_arrow"]["compiles"] == rows["beam_jax"]["compiles"]


def test_embed_text_bench_measures_the_host_alone(tmp_path):
    """The host-only variants run the flagship end to end, both paths, with a trivial kernel."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import embed_text
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "bench.json"
    report = embed_text.main(
        ["--variants", "host_only,host_only_per_element", "--texts", "60", "--rounds", "1",
         "--json", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text())["variants"].keys() == {"host_only", "host_only_per_element"}
    for variant in report["variants"].values():
        assert variant["sentences_per_s"] > 0 and variant["compiles"] >= 1
    assert report["ratios"]["host_only_vs_host_only_per_element"] > 0


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
