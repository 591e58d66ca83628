"""What a runnable job needs around its pipeline: a staged output directory, a progress
line, a quiet console, dead letters as JSON lines, and a metrics report beside its output."""
