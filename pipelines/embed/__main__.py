"""``python -m pipelines.embed``: the flagship embedding job (see :mod:`pipelines.embed.job`)."""

# Imported by its package name, so that what Beam pickles refers to `pipelines.embed.job`,
# which workers can import, and not to `__main__`.
from pipelines.embed.job import main

if __name__ == "__main__":
    main()
