"""The benchmarks: what each entry point measures, and its command, is in bench/README.md.

The entry points are the modules of this folder (``python bench/run.py``, or ``python -m
bench.run`` from the repository's root); what they share is in the private ``bench._lib``.
"""
