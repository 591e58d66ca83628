"""beam_jax.jobs' command-line helpers: value types, the help formatter, one parse for a
job's flags and Beam's."""

from __future__ import annotations

import argparse
import os
import pathlib
import re

import pytest
from apache_beam.options.pipeline_options import SetupOptions, StandardOptions
from hypothesis import given
from hypothesis import strategies as st

from beam_jax import jobs
from beam_jax._src.jobs.flags import DEFAULT_COMPILATION_CACHE


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="job", formatter_class=jobs.DefaultsHelpFormatter)
    parser.add_argument("--sizes", type=jobs.int_list, default=(16, 32), help="sizes")
    parser.add_argument("--rows", type=jobs.positive_int, default=5, help="rows")
    parser.add_argument("--threshold", type=jobs.ratio, default=1.0, help="ratio")
    parser.add_argument("--cost", type=jobs.non_negative, help="cost (default: none)")
    jobs.add_compilation_cache_flag(parser)
    return parser


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=8))
def test_int_list_reads_what_it_shows(values):
    assert jobs.int_list(",".join(map(str, values))) == tuple(values)
    assert jobs.int_list(" , ".join(map(str, values)) + ",") == tuple(values)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (jobs.int_list, "1,x", "expected comma-separated ints, got '1,x'"),
        (jobs.int_list, ",", "expected at least one int"),
        (jobs.positive_int, "0", "expected a positive int, got '0'"),
        (jobs.ratio, "1.5", r"expected a ratio in \[0, 1\], got '1.5'"),
        (jobs.ratio, "nan", "expected a ratio"),
        (jobs.non_negative, "-1", "expected a number >= 0, got '-1'"),
        (jobs.non_negative, "nan", "expected a number >= 0"),
    ],
)
def test_value_types_say_what_they_got(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse(text)


def test_help_shows_defaults_once_and_tuples_as_typed():
    text = _parser().format_help()
    assert "(default: 16,32)" in text and "(default: 5)" in text
    assert "(default: none)" in text and "(default: none) (default" not in text


def test_job_flags_and_beam_flags_are_split_and_the_runner_defaults(tmp_path):
    argv = ["--rows", "3", "--direct_num_workers=2", "--compilation_cache_dir", str(tmp_path)]
    args, options = jobs.parse_job_args(_parser(), argv)
    assert args.rows == 3 and args.compilation_cache_dir == str(tmp_path)
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    assert options.get_all_options()["direct_num_workers"] == 2
    assert options.view_as(SetupOptions).save_main_session is False


def test_the_compilation_cache_is_local_runs_only_and_can_be_turned_off():
    args, _ = jobs.parse_job_args(_parser(), [])
    assert args.compilation_cache_dir == os.path.expanduser(DEFAULT_COMPILATION_CACHE)
    args, _ = jobs.parse_job_args(_parser(), ["--compilation_cache_dir", "none"])
    assert args.compilation_cache_dir is None
    args, _ = jobs.parse_job_args(_parser(), ["--runner", "DataflowRunner"])
    assert args.compilation_cache_dir is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rowz", "3"], "unrecognized arguments: --rowz .*did you mean --rows for --rowz"),
        (["stray"], "unrecognized arguments: stray"),
        (["-x"], "unrecognized arguments: -x"),
        (
            ["--dry_run=true"],
            "--dry_run .* only with --runner DataflowRunner, got --runner FnApiRunner",
        ),
    ],
)
def test_a_flag_neither_the_job_nor_beam_knows_stops_the_launch(argv, message, capsys):
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), argv)
    assert re.search(message, capsys.readouterr().err)


def test_worker_processes_that_would_share_a_tpu_stop_the_launch(monkeypatch, capsys):
    """On a TPU host (the PCI reading says so; JAX_PLATFORMS leaves the choice to JAX),
    several multi_processing workers would each open the chip: refused at launch."""
    from beam_jax._src import probe

    tpu = probe.LocalPlatform("tpu", device_count=4, kind="TPU v5 lite", opened=False)
    monkeypatch.setattr(probe, "_tpu_on_pci_bus", lambda: tpu)
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: None)
    shared = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), shared)
    err = capsys.readouterr().err
    assert "starts 2 worker processes, but this machine's 4 TPU v5 lite device(s)" in err
    assert "--direct_num_workers=N then runs N bundles in threads" in err
    # One worker process, threads, or another runner: nothing shares the chips.
    for argv in (
        ["--direct_running_mode=multi_processing", "--direct_num_workers=1"],
        ["--direct_running_mode=multi_threading", "--direct_num_workers=2"],
        ["--direct_num_workers=2"],
        ["--runner=DataflowRunner", *shared],
    ):
        jobs.parse_job_args(_parser(), argv)
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: "cpu")  # JAX_PLATFORMS=cpu
    jobs.parse_job_args(_parser(), shared)
    monkeypatch.setattr(probe, "_first_platform_asked", lambda: None)
    monkeypatch.setattr(probe, "_tpu_on_pci_bus", lambda: None)  # no TPU here
    jobs.parse_job_args(_parser(), shared)


def _dashed_parser() -> argparse.ArgumentParser:
    parser = _parser()
    parser.add_argument("--id_column", default="id")
    parser.add_argument("--max-size", type=int)  # a flag defined with a dash
    jobs.add_flags(parser)
    return parser


def test_every_flag_takes_either_spelling_the_job_s_and_beam_s():
    argv = ["--id-column", "doc", "--max_size", "8", "--no_progress", "--progress-seconds", "1",
            "--temp-location=/tmp/x", "--direct-num-workers", "2", "--rows=4"]  # fmt: skip
    args, options = jobs.parse_job_args(_dashed_parser(), argv)
    assert (args.id_column, args.max_size, args.progress, args.progress_seconds) == (
        "doc", 8, False, 1.0,
    )  # fmt: skip
    assert args.rows == 4
    got = options.get_all_options()
    assert got["temp_location"] == "/tmp/x" and got["direct_num_workers"] == 2


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (["--id-colum", "doc"], "did you mean --id_column for --id-colum?"),
        (["--id_colum", "doc"], "did you mean --id_column for --id_colum?"),
        (["--max_siz", "3"], "did you mean --max-size for --max_siz?"),
        (["--no-progres"], "did you mean --no-progress for --no-progres?"),
        (["--temp-locaton", "x"], "did you mean --temp_location for --temp-locaton?"),
        (["--flink-mastr", "x"], "did you mean --flink_master for --flink-mastr?"),
    ],
)
def test_a_misspelled_flag_of_either_spelling_is_refused_with_the_closest(argv, hint, capsys):
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_dashed_parser(), argv)
    err = capsys.readouterr().err
    assert "unrecognized arguments: " + argv[0] in err and hint in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["--runner", "FlinkRunner", "--flink_master", "localhost:8081", "--parallelism", "2"],
        ["--runner", "SparkRunner", "--spark-master-url", "spark://h:7077"],
        ["--runner", "DataflowRunner", "--project", "p", "--region", "r",
         "--dataflow_service_options", "a=b", "--worker-machine-type", "n1-standard-4"],
        ["--runner", "PrismRunner", "--prism_location", "/bin/prism"],
    ],
)  # fmt: skip
def test_the_runners_own_options_pass_through_to_beam(argv):
    _, options = jobs.parse_job_args(_parser(), argv)
    got = options.get_all_options(drop_default=True)
    for flag, value in zip(argv[2::2], argv[3::2], strict=True):
        key = flag[2:].replace("-", "_")
        key = {"worker_machine_type": "machine_type"}.get(key, key)
        assert str(got[key]) == value or got[key] == [value], (flag, got)


def test_a_runner_s_module_registers_its_options_and_a_pipeline_reads_them():
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    argv = ["--runner", "tests.runner_options.OwnRunner", "--own-cluster-address", "tcp://h:1",
            "--own_workers", "3"]  # fmt: skip
    _, options = jobs.parse_job_args(_parser(), argv)
    from tests.runner_options import OwnRunnerOptions

    own = options.view_as(OwnRunnerOptions)
    assert (own.cluster, own.own_workers) == ("tcp://h:1", 3)
    with beam.Pipeline(options=options) as p:  # OwnRunner checks the option it was given
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 10), equal_to([10, 20]))
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), [*argv[:2], "--own_worker", "3"])


def test_a_runner_module_is_imported_only_when_a_flag_needs_it(tmp_path, monkeypatch, capsys):
    from beam_jax._src.jobs import flag_names

    name = f"lazy_runner_{os.getpid()}"
    (tmp_path / f"{name}.py").write_text(
        "from apache_beam.options.pipeline_options import PipelineOptions\n"
        "class LazyOptions(PipelineOptions):\n"
        "    @classmethod\n"
        "    def _add_argparse_args(cls, parser):\n"
        "        parser.add_argument('--lazy_cluster_address')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(flag_names.RUNNER_OPTION_MODULES, name, "lazy-package[extra]")
    import sys

    jobs.parse_job_args(_parser(), ["--rows", "2"])
    assert name not in sys.modules  # nothing unknown: nothing imported
    _, options = jobs.parse_job_args(_parser(), ["--lazy-cluster-address", "tcp://h:2"])
    assert name in sys.modules
    assert options.get_all_options()["lazy_cluster_address"] == "tcp://h:2"
    # A module that does not import: its flags are named with what installs it.
    broken = f"broken_runner_{os.getpid()}"
    (tmp_path / f"{broken}.py").write_text(
        "import no_such_package_here\nparser.add_argument('--broken_address')\n"
    )
    monkeypatch.setitem(flag_names.RUNNER_OPTION_MODULES, broken, "broken-package[extra]")
    for flag, said in [
        ("--broken_address", ""),
        ("--broken-adress", "did you mean --broken_address? "),
    ]:  # noqa: E501
        with pytest.raises(SystemExit):
            jobs.parse_job_args(_parser(), [flag, "x"])
        err = capsys.readouterr().err
        assert f"{said}--broken_address is an option of {broken}, which does not import here " \
               "(ModuleNotFoundError: No module named 'no_such_package_here'); install " \
               "broken-package[extra]" in err, err  # fmt: skip


def test_dask_s_options_pass_through_or_say_what_installs_them(capsys):
    argv = ["--runner", "beam_jax.runners.DaskRunner",
            "--dask_client_address", "tcp://127.0.0.1:8786"]  # fmt: skip
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        for args in (argv, argv[2:]):
            with pytest.raises(SystemExit):
                jobs.parse_job_args(_parser(), args)
            assert "install apache-beam[dask]" in capsys.readouterr().err
        return
    from apache_beam.runners.dask.dask_runner import DaskOptions

    for args in (argv, argv[2:], ["--dask-client-address", argv[-1]]):
        _, options = jobs.parse_job_args(_parser(), args)
        assert options.view_as(DaskOptions).address == "tcp://127.0.0.1:8786"
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), ["--dask_client_adress", "x"])
    assert "did you mean --dask_client_address" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("runner", "said"),
    [
        ("DaskRunner", "by its path: --runner beam_jax.runners.DaskRunner"),
        ("tests.no_such_module.Runner", "its module tests.no_such_module does not import"),
    ],
)
def test_a_runner_beam_names_only_by_path_or_one_that_does_not_import(runner, said, capsys):
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), ["--runner", runner])
    assert said in capsys.readouterr().err


def test_beam_s_modules_with_options_of_their_own_are_all_known():
    """Every PipelineOptions subclass Beam defines outside its options module (examples and
    tests aside) is in RUNNER_OPTION_MODULES, so its flags are found once asked for."""
    import apache_beam

    from beam_jax._src.jobs import flag_names

    root = pathlib.Path(apache_beam.__file__).parent
    found = set()
    pattern = re.compile(r"^class \w+\((?:pipeline_options\.)?PipelineOptions\):", re.M)
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if rel.parts[0] in ("examples", "testing", "options") or path.name.endswith("_test.py"):
            continue
        if pattern.search(path.read_text(encoding="utf-8", errors="replace")):
            found.add("apache_beam." + ".".join(rel.with_suffix("").parts))
    assert found == set(flag_names.RUNNER_OPTION_MODULES), found


def test_a_bad_value_of_beam_s_flag_is_said_with_the_job_s_usage(capsys):
    with pytest.raises(SystemExit):
        jobs.parse_job_args(_parser(), ["--direct_num_workers", "two"])
    err = capsys.readouterr().err
    assert err.startswith("usage: job") and "--direct_num_workers: invalid int value: 'two'" in err


def test_version_prints_every_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        jobs.parse_job_args(_parser(), ["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert re.fullmatch(r"beam-jax \S+ \(apache-beam \S+, jax \S+, Python \S+\)\n", out), out
