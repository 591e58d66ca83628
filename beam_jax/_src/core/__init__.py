"""The pure numpy layer: specs, buckets, boundary planning, validation, the plan, outputs.

Nothing here imports JAX's compiler or Beam, so it tests in milliseconds. Users reach these
pieces through ``beam_jax`` (the common ones) and ``beam_jax.internal`` (the rest).
"""
