"""Around a runnable job's pipeline: its output directory, progress, console and report.

What a job's ``run(argv)`` wraps around ``pipeline.run()``, for any pipeline author:

- the output: :class:`OutputDir` stages the job's files and publishes them only when it
  succeeds (a rerun resumes from finished parts), :class:`OutputLayout` says which files
  are the job's; :func:`write_atomically` and :func:`open_atomically` write a file whole.
- the console: :class:`CountProgress` counts in the workers and :class:`ProgressPrinter`
  prints the driver's progress line; :class:`RunConsole` keeps the logs in a file unless
  ``--verbose`` (:func:`add_flags`); :func:`run_main` ends a failure with one line
  (:func:`failure_line`).
- the flags: :func:`parse_job_args` parses a job's flags and Beam's, rejecting a flag
  neither knows or a worker image of another Beam (:data:`WORKER_IMAGE_BEAM`); the
  others (:func:`int_list`, :func:`ratio`, :class:`DefaultsHelpFormatter`...) help write them.
- the inputs at launch: :func:`input_format`, :func:`match_inputs`, :func:`id_type_of`,
  :func:`column_types`, :func:`values_type` (a categorical column's), and samples for a
  plan (:func:`text_sample`, :func:`sample_texts` with a :class:`RowCount`).
- the results: :func:`embeddings_schema`, :func:`embeddings_table` and
  :func:`write_embeddings` write embeddings as Parquet; :func:`vectors_of` and
  :func:`gather_in_row_order` put a part's results in row order; :func:`dead_letter_json`,
  :class:`WriteDeadLetters` and :func:`read_dead_letters` write and read dead letters as
  JSON lines; :func:`metrics_record` and :func:`write_metrics` write ``_metrics.json`` for
  ``beam-jax report``.
- Dataflow: :func:`dataflow_job_description` (from a ``--dry_run=True`` build,
  :func:`is_dry_run`, :func:`run_dry`) and :func:`write_dataflow_job_file`.
- where the workers run: :func:`workers_here`, :func:`single_worker_here`,
  :func:`devices_per_worker`, :func:`accelerator_workers` and :func:`local_platform` (without
  opening a TPU), so a launch starts their slow part early (:func:`open_local_devices`).
- :func:`counted` words a count; :func:`freeze_startup_objects` keeps a launch's objects out
  of the garbage collector's passes, and :func:`prompt_bundle_ends` ends each bundle of the
  in-process runners when its work ends.

Examples:
    >>> from beam_jax.jobs import OutputDir, OutputLayout, write_atomically
    >>> layout = OutputLayout(published=r"^part-\\d+\\.txt$", record="_my_job.json")
    >>> output = OutputDir("out", layout=layout)
    >>> output.prepare({"inputs": ["a.txt"]}, overwrite=False)
    []
    >>> write_atomically(f"{output.staging}/part-0.txt", b"hello")
    >>> output.publish({"rows": 1})
    ['part-0.txt']
"""

from beam_jax._src.core.wording import counted as counted
from beam_jax._src.jobs.bundle_ends import prompt_bundle_ends as prompt_bundle_ends
from beam_jax._src.jobs.console import RunConsole as RunConsole
from beam_jax._src.jobs.console import add_flags as add_flags
from beam_jax._src.jobs.console import failure_line as failure_line
from beam_jax._src.jobs.console import is_local as is_local
from beam_jax._src.jobs.console import prog as prog
from beam_jax._src.jobs.dataflow import dataflow_job_description as dataflow_job_description
from beam_jax._src.jobs.dataflow import is_dry_run as is_dry_run
from beam_jax._src.jobs.dataflow import run_dry as run_dry
from beam_jax._src.jobs.dataflow import write_dataflow_job_file as write_dataflow_job_file
from beam_jax._src.jobs.dead_letters import WriteDeadLetters as WriteDeadLetters
from beam_jax._src.jobs.dead_letters import dead_letter_json as dead_letter_json
from beam_jax._src.jobs.dead_letters import read_dead_letters as read_dead_letters
from beam_jax._src.jobs.embeddings_file import embeddings_schema as embeddings_schema
from beam_jax._src.jobs.embeddings_file import embeddings_table as embeddings_table
from beam_jax._src.jobs.embeddings_file import gather_in_row_order as gather_in_row_order
from beam_jax._src.jobs.embeddings_file import vectors_of as vectors_of
from beam_jax._src.jobs.embeddings_file import write_embeddings as write_embeddings
from beam_jax._src.jobs.flags import DefaultsHelpFormatter as DefaultsHelpFormatter
from beam_jax._src.jobs.flags import add_compilation_cache_flag as add_compilation_cache_flag
from beam_jax._src.jobs.flags import int_list as int_list
from beam_jax._src.jobs.flags import non_negative as non_negative
from beam_jax._src.jobs.flags import parse_job_args as parse_job_args
from beam_jax._src.jobs.flags import positive_int as positive_int
from beam_jax._src.jobs.flags import ratio as ratio
from beam_jax._src.jobs.heap import freeze_startup_objects as freeze_startup_objects
from beam_jax._src.jobs.images import WORKER_IMAGE_BEAM as WORKER_IMAGE_BEAM
from beam_jax._src.jobs.inputs import InputFile as InputFile
from beam_jax._src.jobs.inputs import RowCount as RowCount
from beam_jax._src.jobs.inputs import column_types as column_types
from beam_jax._src.jobs.inputs import id_type_of as id_type_of
from beam_jax._src.jobs.inputs import input_format as input_format
from beam_jax._src.jobs.inputs import match_inputs as match_inputs
from beam_jax._src.jobs.inputs import sample_texts as sample_texts
from beam_jax._src.jobs.inputs import text_sample as text_sample
from beam_jax._src.jobs.inputs import values_type as values_type
from beam_jax._src.jobs.main import run_main as run_main
from beam_jax._src.jobs.output_dir import OutputDir as OutputDir
from beam_jax._src.jobs.output_dir import OutputExistsError as OutputExistsError
from beam_jax._src.jobs.output_dir import OutputLayout as OutputLayout
from beam_jax._src.jobs.output_dir import open_atomically as open_atomically
from beam_jax._src.jobs.output_dir import write_atomically as write_atomically
from beam_jax._src.jobs.progress import CountProgress as CountProgress
from beam_jax._src.jobs.progress import ProgressPrinter as ProgressPrinter
from beam_jax._src.jobs.progress import read_counts as read_counts
from beam_jax._src.jobs.report import metrics_record as metrics_record
from beam_jax._src.jobs.report import write_metrics as write_metrics
from beam_jax._src.jobs.runner_here import accelerator_workers as accelerator_workers
from beam_jax._src.jobs.runner_here import devices_per_worker as devices_per_worker
from beam_jax._src.jobs.runner_here import single_worker_here as single_worker_here
from beam_jax._src.jobs.runner_here import workers_here as workers_here
from beam_jax._src.probe import local_platform as local_platform
from beam_jax._src.probe import open_local_devices as open_local_devices
from beam_jax._src.transforms.embed_text import on_accelerator as on_accelerator

__all__ = [
    "CountProgress",
    "DefaultsHelpFormatter",
    "InputFile",
    "OutputDir",
    "OutputExistsError",
    "OutputLayout",
    "ProgressPrinter",
    "RowCount",
    "RunConsole",
    "WORKER_IMAGE_BEAM",
    "WriteDeadLetters",
    "accelerator_workers",
    "add_compilation_cache_flag",
    "add_flags",
    "column_types",
    "counted",
    "dataflow_job_description",
    "dead_letter_json",
    "devices_per_worker",
    "embeddings_schema",
    "embeddings_table",
    "failure_line",
    "freeze_startup_objects",
    "gather_in_row_order",
    "id_type_of",
    "input_format",
    "int_list",
    "is_dry_run",
    "is_local",
    "local_platform",
    "match_inputs",
    "metrics_record",
    "non_negative",
    "on_accelerator",
    "open_atomically",
    "open_local_devices",
    "parse_job_args",
    "positive_int",
    "prog",
    "prompt_bundle_ends",
    "ratio",
    "read_counts",
    "read_dead_letters",
    "run_dry",
    "run_main",
    "sample_texts",
    "single_worker_here",
    "text_sample",
    "values_type",
    "vectors_of",
    "workers_here",
    "write_atomically",
    "write_dataflow_job_file",
    "write_embeddings",
    "write_metrics",
]
