"""beam_jax's implementation, in layers: compat < bucketing < core < arrow, kernel, text <
engine < transforms < inference, jobs < cli, and beside them modules every layer may use
(errors, files, cores, ragged, probe). Private: import from ``beam_jax`` and its faces."""
