"""``python -m pipelines.curate``: see docs/curate.md."""

from pipelines.curate.job import main

main()
