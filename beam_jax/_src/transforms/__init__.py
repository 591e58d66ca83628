"""The Beam transforms: thin front ends of the batch engine."""
