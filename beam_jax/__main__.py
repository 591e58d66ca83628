"""``python -m beam_jax``: the ``beam-jax`` command without installing its script."""

import sys

from beam_jax._src.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
