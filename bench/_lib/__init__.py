"""What the benchmarks share: rounds and child processes (``harness``), the machine and its
matmul peak (``machine``), ``bench/run.py``'s records and kernels (``records``) and variants
(``variants``, stock Beam's in ``stock``), the embedding flagship's variants
(``embed_variants``), limit (``limit``) and profile (``profile``), and the soak's job
(``soak_job``)."""
