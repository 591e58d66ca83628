"""Beam ML on top of the transforms: RunInference's model handlers (``handler.py``, its
batches through the engine in ``batch.py``), ``RunKernelOnRows`` for Beam YAML and
``FailedInferences``."""
