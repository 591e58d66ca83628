"""The batch engine and what it runs on, no Beam: the engine (``batching.py``), the element
front end, the packing and bucketing stages, the worker, options, fitted batch limits,
metrics and the cross-bundle settings."""
