"""beam_jax.jobs.run_main: a job's entry point ends a failure in one line."""

from __future__ import annotations

import pytest

from beam_jax import jobs


def _raising(error):
    def run(argv):
        raise error

    return run


def test_a_finished_run_returns_quietly():
    seen = []
    jobs.run_main("my_job", seen.append, ["--output", "out"])
    assert seen == [["--output", "out"]]


@pytest.mark.parametrize(
    ("error", "user_errors"),
    [(jobs.OutputExistsError("out holds files; pass --overwrite"), ()),
     (FileNotFoundError("no such file: in.jsonl"), (FileNotFoundError,))],
)  # fmt: skip
def test_an_error_about_the_user_s_files_is_its_message(error, user_errors):
    with pytest.raises(SystemExit) as exit_:
        jobs.run_main("my_job", _raising(error), [], user_errors=user_errors)
    assert str(exit_.value) == f"my_job: {type(error).__name__}: {error}"


def test_any_other_error_is_one_line_saying_where_the_details_are():
    with pytest.raises(SystemExit) as exit_:
        jobs.run_main("my_job", _raising(RuntimeError("boom\nmore")), [])
    assert str(exit_.value) == (
        "my_job failed: RuntimeError: boom (rerun with --verbose for details)"
    )
    assert str(exit_.value) == jobs.failure_line("my_job", RuntimeError("boom\nmore"))


def test_verbose_shows_the_traceback():
    with pytest.raises(RuntimeError, match="boom"):
        jobs.run_main("my_job", _raising(RuntimeError("boom")), ["--verbose"])
