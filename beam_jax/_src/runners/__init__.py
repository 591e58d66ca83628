"""Runner adapters: what a runner needs to run beam_jax's transforms as other runners do."""
