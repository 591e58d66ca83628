"""An ``EmbedParts`` that SIGKILLs its worker process right after writing its Nth part.

Tests put it in place of ``pipelines.embed.job.EmbedParts`` (monkeypatch); Beam pickles it
by reference, so the worker processes import it from here. It kills once per marker file.
"""

import os
import signal

from pipelines.embed.embed_parts import EmbedParts


class KillAfterParts(EmbedParts):
    def __init__(self, *args, marker: str, after: int):
        super().__init__(*args)
        self._marker = marker
        self._after = after

    def start_bundle(self):
        super().start_bundle()
        self._written = 0

    def _names(self, written):
        for name in super()._names(written):  # the part is written
            yield name
            self._written += 1
            if self._written >= self._after and not os.path.exists(self._marker):
                with open(self._marker, "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGKILL)
