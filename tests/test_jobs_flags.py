"""beam_jax.jobs' command-line helpers: value types, the help formatter, one parse for a
job's flags and Beam's."""

from __future__ import annotations

import argparse
import os
import re

import pytest
from apache_beam.options.pipeline_options import SetupOptions, StandardOptions
from hypothesis import given
from hypothesis import strategies as st

from beam_jax import jobs


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
    assert args.compilation_cache_dir == os.path.expanduser(jobs.DEFAULT_COMPILATION_CACHE)
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
