"""Around a runnable job's pipeline: its output directory, progress, console and report.

What a job's ``run(argv)`` wraps around ``pipeline.run()``, for any pipeline author:

- :class:`OutputDir` stages the job's files under ``OUTPUT/_unfinished/`` and publishes
  them only when the job succeeds (a rerun of the same job resumes from finished parts);
  :class:`OutputLayout` says which files are the job's; :func:`write_atomically` and
  :func:`open_atomically` write a file whole or not at all.
- :class:`CountProgress` counts elements in the workers and :class:`ProgressPrinter`
  prints a progress line on the driver (local runners): :func:`progress_line`, rows done
  of the total, the share, the dead letters and the time left.
- :class:`RunConsole` keeps Beam's and JAX's logs in a log file unless ``--verbose``
  (:func:`add_flags`), prints the progress line, and :func:`failure_line` says in one line
  what failed and where the traceback is; :func:`run_main` is a job's ``main`` that ends a
  failure with that line.
- :func:`parse_job_args` parses a job's flags and Beam's, rejecting a flag neither knows
  (:func:`reject_unknown_flags`, with a suggestion); :func:`int_list`, :func:`positive_int`,
  :func:`non_negative`, :func:`ratio` and :class:`DefaultsHelpFormatter` help write the
  job's parser.
- :func:`input_format`, :func:`match_inputs` (:class:`InputFile`) and :func:`id_type_of`
  check a job's input files at launch: their format, what a rerun must find unchanged, the
  type of their id column (:func:`column_types`: of the columns a job carries through);
  :func:`text_sample` reads a file's first texts (and its row
  count) for a plan made from a sample, :func:`sample_texts` a sample spread over all the
  files with their :class:`RowCount` (counted, estimated or unknown).
- :func:`embeddings_schema`, :func:`embeddings_table` and :func:`write_embeddings` write
  embeddings (and the input columns a job carries through) as Parquet, as the flagship
  writes its parts; :func:`vectors_of` and :func:`gather_in_row_order` put a part's
  results from any batches in row order.
- :func:`dead_letter_json` writes a failed element (``beam_jax.FailedElement``) as one
  JSON line, :class:`WriteDeadLetters` a PCollection of them as ``.jsonl`` files, counted
  per stage, and :func:`read_dead_letters` reads such files back as records.
- :func:`dataflow_job_description` is the request ``DataflowRunner`` would send, from a
  ``--dry_run=True`` run (:func:`is_dry_run`; :func:`run_dry` runs such a build and says so),
  checked offline; :func:`write_dataflow_job_file`
  writes it and :func:`dataflow_staged_files` lists what the workers would install.
- :func:`beam_version_mismatch` says why a job's workers would run another Beam than the
  SDK that launches it (:func:`image_beam_version` reads it from the image's name;
  :data:`WORKER_IMAGE_BEAM` is the project's images'); :func:`parse_job_args` refuses
  such a job before anything is staged.
- :func:`metrics_record` and :func:`write_metrics` write ``OUTPUT/_metrics.json``, which
  ``beam-jax report OUTPUT`` prints.
- :func:`local_platform` (:class:`LocalPlatform`) says what the job's local workers run
  on (CPU, GPU or TPU, and how many devices) without opening a TPU that is not open yet,
  so a launch can choose its defaults while the device opens in the background, and
  :func:`open_local_devices` starts that opening first thing, after
  :func:`size_tpu_host_buffer` has sized the host buffer a TPU maps as it opens (seconds
  of its opening with libtpu's default), and :func:`tpu_host_buffer_advice` says what to
  set where a batch outgrows it.
- :func:`workers_here`, :func:`single_worker_here`, :func:`bundle_workers`,
  :func:`devices_per_worker` and :func:`accelerator_workers` say where the runner runs the
  job's workers (in this process, one bundle at a time or several) and on what devices, so
  a launch can start their slow part during the launch.
- :func:`counted` words a count ("1 dead letter", "2 dead letters").
- :func:`freeze_startup_objects` keeps the objects alive at a job's launch (imported
  modules) out of the garbage collector's passes while the job runs, and
  :func:`prompt_bundle_ends` ends each bundle of the in-process runners when its work ends.

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
    "vectors_of",
    "workers_here",
    "write_atomically",
    "write_dataflow_job_file",
    "write_embeddings",
    "write_metrics",
]
