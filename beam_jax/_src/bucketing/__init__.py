"""Bucketing policy, in one home: pure numpy, no compiler, no Beam.

- ``rule.py``: which bucket an element goes to (``boundary_index``/``bucket_index``), the
  one rule every path uses, and the default boundaries and batch sizes;
- ``buckets.py``: ``Bucketing``, the configuration (boundaries, batch sizes, oversize);
- ``boundaries.py``: ``plan_boundaries``, boundaries that minimise padding for a budget;
- ``bucketing_choice.py``: ``plan_bucketing``, boundaries and batch sizes together;
- ``fit.py``: ``FitToMemory`` and ``search_limits``, batch sizes fitted to analysed bytes.

A policy that shapes batches differently (e.g. packing several short records into one row)
is a module beside these, using ``rule.py``'s assignment; the plan (``core/plan.py``) turns
the chosen ``Bucketing`` into the compile set.
"""
