"""beam_jax.jobs.run_main: a job's entry point ends a failure in one line, and imports no
IPython for Beam to ask whether it runs in a session."""

from __future__ import annotations

import importlib
import sys
import types

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

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


@pytest.fixture
def installed_ipython(tmp_path, monkeypatch):
    """An IPython package on the path that notes each import of it in a file."""
    package = tmp_path / "IPython"
    package.mkdir()
    marker = tmp_path / "imported"
    (package / "__init__.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\ndef get_ipython():\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    yield marker
    sys.modules.pop("IPython", None)  # not left for other tests (matplotlib looks for it)


def _run_a_pipeline(argv):
    with beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"])) as p:
        result = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
        assert_that(result, equal_to([2, 4, 6]))


def test_a_job_s_beam_pipeline_does_not_import_ipython(installed_ipython):
    _run_a_pipeline([])  # Beam asks for IPython as it applies and runs the pipeline
    assert installed_ipython.read_text() == "x"
    del sys.modules["IPython"]
    installed_ipython.unlink()

    jobs.run_main("my_job", _run_a_pipeline, [])  # the same answer, without the import
    assert not installed_ipython.exists()
    assert "IPython" not in sys.modules  # and a later import works
    importlib.import_module("IPython")
    assert installed_ipython.read_text() == "x"


def test_ipython_stays_importable_after_a_failed_job(installed_ipython):
    with pytest.raises(SystemExit):
        jobs.run_main("my_job", _raising(RuntimeError("boom")), [])
    assert "IPython" not in sys.modules
    assert importlib.import_module("IPython").get_ipython() is None


def test_an_imported_ipython_is_left_for_beam_to_see(monkeypatch):
    session = types.ModuleType("IPython")
    monkeypatch.setitem(sys.modules, "IPython", session)
    seen = []
    jobs.run_main("my_job", lambda argv: seen.append(sys.modules["IPython"]), [])
    assert seen == [session] and sys.modules["IPython"] is session
