"""beam_jax's implementation, in layers (core < arrow, kernel < engine < transforms <
inference; cli on top). Private: import from ``beam_jax``, ``beam_jax.internal`` or
``beam_jax.testing``; these module paths may change without notice."""
