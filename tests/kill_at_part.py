"""An ``EmbedParts`` that SIGKILLs its worker process right after writing one given part.

Tests put it in place of ``pipelines.embed.job.EmbedParts`` (monkeypatch); it is pickled by
reference, so the worker processes import it from here. Every attempt at the bundle that
writes the part kills its process, until the marker file lists ``times`` kills (one
line each, the killed process's id): the kills land on one task, however the parts are
spread over bundles, so the runner's retry limit decides the outcome.
"""

import os
import signal

from pipelines.embed.embed_parts import EmbedParts


class KillAtPart(EmbedParts):
    def __init__(self, *args, marker: str, part: str, times: int = 1):
        super().__init__(*args)
        self._marker = marker
        self._part = part
        self._times = times

    def _names(self, written):
        for name in super()._names(written):  # the part is written
            yield name
            if self._part in name.value and self._kills() < self._times:
                with open(self._marker, "a") as f:
                    f.write(f"{os.getpid()}\n")
                os.kill(os.getpid(), signal.SIGKILL)

    def _kills(self) -> int:
        if not os.path.exists(self._marker):
            return 0
        with open(self._marker) as f:
            return len(f.read().split())
