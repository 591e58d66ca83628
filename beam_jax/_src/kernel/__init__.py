"""The JAX layer: the compiled kernel, start-up compiles, devices, parameters, kernel
wrappers, the compilation cache and the memory analysis of a shape."""
