"""Beam ML front ends of the batch engine: RunInference model handlers."""
