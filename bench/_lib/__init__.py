"""What the benchmarks share: rounds and child processes (``harness``), the machine and its
matmul peak (``machine``), the records and kernels of ``bench/run.py`` (``records``) and its
variants (``variants``), and the embedding flagship's variants (``embed_variants``), its
limit (``limit``) and its profile (``profile``)."""
