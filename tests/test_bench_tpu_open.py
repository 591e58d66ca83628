"""``bench/tpu_open.py``: the opening and the transfers by the TPU's host buffer size."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import tpu_open  # noqa: E402


def test_buffer_sizes_are_parsed_and_checked():
    assert tpu_open.parse_buffer("libtpu") is None
    assert tpu_open.parse_buffer("256MiB") == 256 * 2**20
    assert tpu_open.parse_buffer(" 1GiB ") == 2**30
    assert tpu_open.parse_buffer("1048576") == 2**20
    for bad in ("", "1KiB", "2GB", "-5MiB", "1.5GiB", "4 GiBs"):
        with pytest.raises(ValueError, match=f"at least 1 MiB.*got {bad!r}"):
            tpu_open.parse_buffer(bad)


def test_each_buffer_runs_in_a_process_of_its_own_with_its_size_set(tmp_path, capsys):
    report = tpu_open.main(
        ["--buffers", "libtpu,64MiB", "--rounds", "1", "--transfer_mb", "1,2",
         "--json", str(tmp_path / "r.json")]
    )  # fmt: skip
    runs = report["runs"]
    assert list(runs) == ["libtpu", "64 MiB"]
    assert [d["buffer_env"] for d in runs["libtpu"]] == [None]
    assert [d["buffer_env"] for d in runs["64 MiB"]] == [str(64 * 2**20)]
    for (done,) in runs.values():
        assert 0 < done["open_s"] < done["process_s"]
        assert set(done["gb_s"]) == {"1", "2"}
        assert all(rate > 0 for rates in done["gb_s"].values() for rate in rates)
    table = capsys.readouterr().out
    assert "| 64 MiB | " in table and "| 2 MB put / get GB/s |" in table
    assert (tmp_path / "r.json").exists()
