"""beam_jax.jobs.freeze_startup_objects: a job's launch objects out of the collector's passes."""

from __future__ import annotations

import gc

import pytest

from beam_jax import jobs


@pytest.fixture(autouse=True)
def _nothing_frozen():
    gc.unfreeze()  # whatever an earlier test left
    yield
    gc.unfreeze()


def test_objects_alive_at_the_start_are_frozen_until_the_block_ends():
    before = object(), [1, 2]
    with jobs.freeze_startup_objects():
        assert gc.get_freeze_count() >= len(gc.get_objects()) // 2
        assert gc.is_tracked(before[1]) and not any(o is before[1] for o in gc.get_objects())
        made = [3, 4]
        assert any(o is made for o in gc.get_objects())  # new objects are collected as usual
    assert gc.get_freeze_count() == 0
    assert any(o is before[1] for o in gc.get_objects())


def test_a_failing_block_gives_the_objects_back():
    with pytest.raises(RuntimeError, match="boom"), jobs.freeze_startup_objects():
        raise RuntimeError("boom")
    assert gc.get_freeze_count() == 0


def test_garbage_made_in_the_block_is_collected():
    class Cycle:
        pass

    with jobs.freeze_startup_objects():
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        del a, b
        assert gc.collect() >= 2


def test_objects_frozen_by_the_caller_stay_frozen():
    # (By identity, not by count: another thread may free frozen objects meanwhile.)
    kept = [0]
    gc.freeze()
    after = [1]  # made after the caller's freeze: the block must not freeze it
    with jobs.freeze_startup_objects():
        assert any(o is after for o in gc.get_objects())
        assert not any(o is kept for o in gc.get_objects())
    assert not any(o is kept for o in gc.get_objects())  # nor unfreeze the caller's


def test_as_a_decorator_each_call_freezes_and_gives_back():
    counts = []

    @jobs.freeze_startup_objects()
    def run():
        counts.append(gc.get_freeze_count())

    run()
    run()
    assert all(counts) and len(counts) == 2 and gc.get_freeze_count() == 0
