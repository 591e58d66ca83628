"""What a runnable job needs around its pipeline: a staged output directory, a progress
line, a quiet console, and a metrics report written beside its output."""
