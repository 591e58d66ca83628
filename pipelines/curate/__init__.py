"""Find mislabelled records: full-batch training passes, then per-record gradient scores
(GraNd, EL2N), each stage one Beam pipeline run. See docs/curate.md.

``python -m pipelines.curate`` (or ``beam-jax curate``) runs :func:`run`. The modules, one
job each: ``flags`` (the command line), ``read`` (rows to tokenized records), ``model`` (the
classifier and its kernels, pure JAX), ``passes`` (the training and scoring pipelines),
``report`` (the metrics, summary and plot) and ``job`` (the stages in order).

Example:
    >>> summary = run(["--output", "/tmp/curate"])  # doctest: +SKIP
    >>> summary.auroc["grand"] > 0.9  # doctest: +SKIP
    True
"""

from beam_jax.jobs import OutputExistsError
from pipelines.curate.flags import DEFAULT_PASSES, parse_args
from pipelines.curate.job import main, run
from pipelines.curate.report import CurateSummary

__all__ = ["DEFAULT_PASSES", "CurateSummary", "OutputExistsError", "main", "parse_args", "run"]
