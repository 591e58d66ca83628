"""The JAX layer: the compiled kernel, devices, parameters, wrappers and the compile cache."""
