"""``bench/embed.py``: the flagship against its limit and its peers on the device it finds,
on the built-in texts or a corpus of one's own, and ``--profile``'s timeline and trace."""

from __future__ import annotations

import argparse
import json
import random
import sys

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench import embed
from bench._lib import embed_variants, profile

_TRACE = """
planes {
  id: 1
  name: "/device:TPU:0"
  lines {
    id: 1
    name: "XLA Modules"
    timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 10000000000 }
    events { metadata_id: 1 offset_ps: 12000000000 duration_ps: 10000000000 }
    events { metadata_id: 1 offset_ps: 20000000000 duration_ps: 6000000000 }
  }
  event_metadata { key: 1 value { id: 1 name: "jit_packed_fn" } }
}
planes {
  id: 2
  name: "/host:CPU"
  lines {
    id: 1
    name: "python"
    timestamp_ns: 500
    events { metadata_id: 2 offset_ps: 0 duration_ps: 1000 }
  }
  event_metadata { key: 2 value { id: 2 name: "bench_profile_anchor" } }
}
"""


def _write_trace(path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "host.xplane.pb").write_bytes(
        jax.profiler.ProfileData.text_proto_to_serialized_xspace(text)
    )


def test_the_devices_busy_time_is_the_union_of_its_batches_over_their_window(tmp_path):
    # Batches at 0-10, 12-22 and 20-26 ms: busy 24 ms (the overlap counted once) of 26; the
    # first starts 500 ns after the anchor, on the trace's clock.
    _write_trace(tmp_path, _TRACE)
    got = profile.device_batches(str(tmp_path))
    assert got["batches"] == 3
    assert got["median_batch_ms"] == pytest.approx(10.0)
    assert got["busy_s"] == pytest.approx(0.024)
    assert got["window_s"] == pytest.approx(0.026)
    assert got["first_s"] - got["anchor_at"] == pytest.approx(500e-9)
    assert got["last_s"] - got["first_s"] == pytest.approx(0.026)


def test_a_trace_without_a_device_line_says_so_and_no_trace_fails(tmp_path):
    _write_trace(tmp_path / "cpu", _TRACE[_TRACE.index("planes {\n  id: 2") :])
    got = profile.device_batches(str(tmp_path / "cpu"))
    assert got["batches"] == 0 and got["anchor_at"] == pytest.approx(500e-9)
    with pytest.raises(RuntimeError, match="no trace"):
        profile.device_batches(str(tmp_path / "empty"))


def _longer_texts(path, n: int) -> list[str]:
    """A corpus of ``n`` texts of 90-120 words (about 100 tokens each), as Parquet."""
    rng = random.Random(0)
    words = ("the model reads each record once and writes its embedding beside the others "
             "while the device runs the batches that the host packed for it").split()  # fmt: skip
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(90, 120))) for _ in range(n)]
    pq.write_table(pa.table({"body": texts, "other": list(range(n))}), path)
    return texts


def test_a_users_corpus_of_longer_texts_the_limit_and_the_host_on_this_device(tmp_path, capsys):
    """``--parquet``: the whole corpus, every variant on the device the job would use (here
    the CPU, as the tests pin it), each round printed as it ends with the device it timed,
    the limit's compiles as they happen; the flagship and its limit agree, and the host
    alone writes what its trivial kernel gives."""
    corpus = tmp_path / "corpus.parquet"
    texts = _longer_texts(corpus, 40)
    report = embed.main(
        ["--parquet", str(corpus), "--column", "body", "--rounds", "1",
         "--variants", "limit,pipeline,host_only,tokenize_only",
         "--json", str(tmp_path / "r.json"), "--keep-outputs", str(tmp_path / "runs")]
    )  # fmt: skip
    assert json.loads((tmp_path / "r.json").read_text())["ratios"] == report["ratios"]
    assert report["texts"] == 40 and report["tokens"] / 40 >= 90  # long texts, all of them
    assert report["source"] == f"{corpus} (body, 0 nulls left out)"
    rows = report["variants"]
    for name in ("limit", "pipeline", "host_only"):
        assert rows[name]["device"].startswith("cpu ("), name
        assert rows[name]["texts_per_s"] > 0
    assert rows["tokenize_only"]["device"] == "host (no JAX)"
    for name in ("limit", "pipeline"):
        assert 0 < rows[name]["mfu"] < 1 and rows[name]["matmuls"] in ("float32", "bfloat16")
    assert rows["host_only"]["mfu"] is None
    assert rows["limit"]["shapes"] >= 1 and rows["limit"]["batches"] >= 1
    roof = rows["limit"]["roofline"]  # XLA's accounting of the timed batches
    assert roof["batches"] == rows["limit"]["batches"] and roof["tokens"] >= report["tokens"]
    assert roof["flops"] >= 0.9 * report["flops"] and 0 < roof["least_bytes"] < roof["bytes"]
    assert len(roof["lines"]) == 3 and roof["lines"][2].startswith("MFU bound at XLA's traffic")
    pairs = (("pipeline", "limit"), ("host_only", "limit"), ("host_only", "tokenize_only"))
    for ours, theirs in pairs:
        assert report["ratios"][f"{ours}_vs_{theirs}"] == pytest.approx(
            rows[theirs]["timed_s"] / rows[ours]["timed_s"]
        )
    assert report["min_cosine"]["reference"] == "pipeline"
    assert report["min_cosine"]["limit"] > 0.9999
    out = capsys.readouterr().out
    assert f"40 texts from {corpus} (body, 0 nulls left out)" in out
    for name in ("limit", "pipeline", "host_only"):
        assert f"round 1 {name}: " in out and " on cpu (" in out
    assert "    | limit: 40 texts in " in out and " ready in " in out  # the child, as it runs
    assert "pipeline_vs_limit: " in out and "XLA environment:" in out and " GB/s;" in out
    assert "roofline, limit: per token slot and layer: " in out and "ridge" in out
    host = embed_variants.load_vectors(str(tmp_path / "runs" / "host_only-0"), 40)
    np.testing.assert_array_equal(host, embed_variants.expected_host_only(texts))


def test_a_corpus_is_cycled_or_cut_to_the_texts_asked_for(tmp_path):
    corpus = tmp_path / "corpus.parquet"
    texts = _longer_texts(corpus, 5)
    args = argparse.Namespace(parquet=str(corpus), column="body", texts=12, model_dir=None)
    data = embed.write_data(tmp_path, args)
    written = pq.read_table(data["parquet"])
    assert written.column("text").to_pylist() == [texts[i % 5] for i in range(12)]
    assert written.column("id").to_pylist() == list(range(12)) and data["n"] == 12
    pq.write_table(pa.table({"body": ["a cat", None, "a dog"]}), corpus)  # a null is no text
    data = embed.write_data(tmp_path, argparse.Namespace(**{**vars(args), "texts": None}))
    assert pq.read_table(data["parquet"]).column("text").to_pylist() == ["a cat", "a dog"]
    assert data["source"] == f"{corpus} (body, 1 nulls left out)"


def test_sentence_transformers_runs_on_the_device_asked_for(tmp_path):
    """--st-device reaches the interpreter that runs sentence-transformers, which reports
    the device; ``_bf16`` runs under autocast (here stand-ins for torch and
    sentence-transformers on that interpreter's path: no torch in the project's install)."""
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
    report = embed.main(
        ["--variants", "sentence_transformers,sentence_transformers_bf16", "--texts", "20",
         "--rounds", "1", "--st-python", str(python), "--st-device", "cuda:7",
         "--keep-outputs", str(tmp_path / "runs")]
    )  # fmt: skip
    st, bf16 = (report["variants"][v] for v in embed_variants.ST_VARIANTS)
    assert st["device"] == "torch cuda:7" and st["torch"] == "stand-in"
    assert (st["matmuls"], bf16["matmuls"]) == ("float32", "bfloat16")
    assert st["process_s_median"] > st["seconds_median"] > 0  # the whole process, timed too
    plain = np.load(tmp_path / "runs" / "sentence_transformers-0" / "vectors.npy")
    autocast = np.load(tmp_path / "runs" / "sentence_transformers_bf16-0" / "vectors.npy")
    np.testing.assert_array_equal(autocast, 2 * plain)  # the stand-in's mark of autocast


def test_a_run_past_its_timeout_is_stopped_and_says_where_it_was():
    """A child starting Python, JAX and the model's tokenizer takes well over 0.3 s."""
    with pytest.raises(RuntimeError, match=r"tokenize_only \(round 1\) ran past its timeout"
                       ) as stopped:  # fmt: skip
        embed.main(["--variants", "tokenize_only", "--texts", "20", "--rounds", "1",
                    "--timeout", "0.3"])  # fmt: skip
    assert "(most recent call first)" in str(stopped.value)
    with pytest.raises(SystemExit):
        embed.main(["--variants", "limit,nonsense"])


@pytest.mark.slow
def test_profile_times_a_fresh_process_phase_by_phase_and_keeps_its_trace(tmp_path, capsys):
    report = embed.main(
        ["--profile", "--quick", "--texts", "60", "--no-cold", "--json", str(tmp_path / "r"),
         "--cache-dir", str(tmp_path / "cache"), "--profile_dir", str(tmp_path / "traces")]
    )  # fmt: skip
    run = report["runs"]["warm 1"]
    assert run["device"].startswith("cpu (")
    marks = run["marks"]
    keys = [k for k, _ in profile.PHASES if k not in ("first_batch", "last_batch")]
    times = [marks[k] for k in keys]
    assert times == sorted(times) and 0 < marks["jax"], marks
    # The trace's writing and reading is the profile's own, named apart from the job's end.
    own = marks["traced"] - marks["returned"]
    assert f"({own:.1f} s of it writing and reading the trace)" in report["summary"]
    # A CPU's trace has no device line: no batch times, and the table says so.
    assert run["trace"]["batches"] == 0 and "first_batch" not in marks
    out = capsys.readouterr().out
    assert "no device line in the trace (a CPU)" in out and "devices open" in out
    assert list((tmp_path / "traces" / "warm_1").rglob("*.xplane.pb"))
    assert any((tmp_path / "cache").iterdir())  # the compilation cache it was given, kept
