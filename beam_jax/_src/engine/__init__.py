"""The batch engine and the per-worker state it runs on (options, worker, metrics)."""
