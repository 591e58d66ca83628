"""The Beam transforms, thin front ends of the batch engine: RunKernel, ReduceKernel,
RunKernelOnArrow, cross-bundle mode, EmbedText (and its tokenize step), ReadRowsWithOrigin."""
