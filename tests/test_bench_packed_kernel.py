"""bench/packed_kernel.py times the packed kernel alone: each shape asked for, each figure."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
packed_kernel = pytest.importorskip("packed_kernel")


def test_each_shape_is_timed_with_its_transfers():
    rows = packed_kernel.main(["--shapes", "4x32x2,2x64x4", "--calls", "2"])
    assert [r["shape"] for r in rows] == ["4x32x2", "2x64x4"]
    for r in rows:
        for key in ("compute_ms", "one_in_flight_ms", "two_in_flight_ms", "send_ms", "fetch_ms"):
            assert r[key] > 0, (key, r)
        assert r["out_mb"] == pytest.approx(
            int(r["shape"].split("x")[0]) * int(r["shape"].split("x")[2]) * 384 * 4 / 1e6
        )


def test_a_packed_batch_gives_each_text_its_share_of_the_row():
    ids, segments, positions = packed_kernel.packed_batch(3, 10, 3)
    assert ids.shape == segments.shape == positions.shape == (3, 10)
    assert segments[0].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 0]
    assert positions[0].tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]
