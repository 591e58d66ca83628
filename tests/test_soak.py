"""The soak (bench/soak.py), scaled down: 50,000 records, 1% bad, 2 worker processes."""

import re

import numpy as np
import pytest

from bench import soak
from bench._lib import soak_job

RECORDS = 50_000


@pytest.mark.slow
def test_soak_conserves_every_record_and_dead_letters_exactly_the_bad_ones(tmp_path):
    report = soak.run_soak(RECORDS, tmp_path / "soak", seed=3, chunk=2500)
    bad = soak_job.bad_records(RECORDS, seed=3)
    assert len(bad) == RECORDS // 100
    assert set(bad.values()) == set(soak_job.KINDS)
    # What was written, read back: every id exactly once, dead letters exactly the bad ids.
    result_ids, dead = soak_job.read_written(tmp_path / "soak")
    assert sorted(dead) == sorted((i, soak_job.STAGE_OF[kind]) for i, kind in bad.items())
    assert np.array_equal(np.sort(result_ids), np.setdiff1d(np.arange(RECORDS), list(bad)))
    assert report["results_written"] + report["dead_letters_written"] == RECORDS
    assert report["dead_letters_by_stage"]["kernel"] == report["bad_by_kind"]["kernel_fault"]
    assert report["peak_processes"] >= 3, "expected the driver and 2 worker processes"
    assert report["devices"] and all(d.startswith("cpu (") for d in report["devices"])
    assert report["throughput"]["slices"]


def test_records_are_generated_deterministically_from_the_seed():
    bad = soak_job.bad_records(1000, seed=5)
    assert bad == soak_job.bad_records(1000, seed=5) and len(bad) == 10
    ranges = soak_job.id_ranges(1000, 300, bad)
    assert [(lo, hi) for lo, hi, _ in ranges] == [(0, 300), (300, 600), (600, 900), (900, 1000)]
    assert {i: k for *_, chunk_bad in ranges for i, k in chunk_bad.items()} == bad
    first = list(soak_job.make_records(5, ranges[1]))
    again = list(soak_job.make_records(5, ranges[1]))
    assert [k for k, _ in first] == list(range(300, 600))
    for (_, a), (_, b) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda ids, dead: (ids[1:], dead), "1 ids missing, e.g. [0]"),
        (lambda ids, dead: (np.append(ids, ids[5]), dead), "written more than once"),
        (lambda ids, dead: (np.append(ids, dead[0][0]), dead), "both in results and dead"),
        (lambda ids, dead: (ids, dead[1:]), "missing [(7, 'validation')]"),
        (lambda ids, dead: (ids, [(dead[0][0], "kernel"), *dead[1:]]), "unexpected [(7, 'k"),
    ],
)
def test_the_conservation_check_catches_each_kind_of_loss(mutate, message):
    bad = {7: "nan", 20: "kernel_fault"}
    ids = np.array([i for i in range(30) if i not in bad])
    dead = [(7, "validation"), (20, "kernel")]
    soak_job.check_conservation(ids, dead, 30, bad)
    with pytest.raises(AssertionError, match=re.escape(message)):
        soak_job.check_conservation(*mutate(ids, dead), 30, bad)
