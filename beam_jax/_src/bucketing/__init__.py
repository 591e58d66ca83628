"""How batches are shaped, bucketing or packing, in one home: pure numpy, no compiler, no Beam.

- ``rule.py``: which bucket an element goes to (``boundary_index``/``bucket_index``), the
  one rule every path uses, and the default boundaries and batch sizes;
- ``buckets.py``: ``Bucketing``, the configuration (boundaries, batch sizes, oversize);
- ``boundaries.py``: ``plan_boundaries``, boundaries that minimise padding for a budget;
- ``bucketing_choice.py``: ``plan_bucketing``, boundaries and batch sizes together;
- ``fit.py``: ``FitToMemory`` and ``search_limits``, batch sizes fitted to analysed bytes;
- ``packing.py``: ``Packing``, the policy, and the placement of records in rows;
- ``packing_choice.py``: ``plan_packing`` and ``simulate_packing``, from a sample.

The plans (``core/``) turn the chosen configuration into the compile set.
"""
