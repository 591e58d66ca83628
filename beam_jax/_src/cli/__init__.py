"""The ``beam-jax`` command: ``plan``, ``report`` and the pipelines, one module each.

``beam-jax plan`` reads a column's lengths and shows the best bucket boundaries per
compile budget; ``beam-jax report`` shows the metrics a run wrote; ``beam-jax embed`` and
``beam-jax curate`` run the pipelines of ``pipelines/``. See ``beam-jax --help``.
"""
