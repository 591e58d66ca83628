"""Find mislabelled records: full-batch training passes, then per-record gradient scores
(GraNd, EL2N), each stage one Beam pipeline run; ``python -m pipelines.curate`` (or
``beam-jax curate``) runs :func:`run`. The modules and their route: docs/curate.md.

Example:
    >>> summary = run(["--output", "/tmp/curate"])  # doctest: +SKIP
    >>> summary.auroc["grand"] > 0.9  # doctest: +SKIP
    True
"""

from pipelines.curate.flags import DEFAULT_PASSES, parse_args
from pipelines.curate.job import main, run
from pipelines.curate.report import CurateSummary

__all__ = ["DEFAULT_PASSES", "CurateSummary", "main", "parse_args", "run"]
