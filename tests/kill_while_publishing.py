"""A job (the flagship, ``embed``, or ``curate``) run in this process, killed
(``os._exit``, as if its machine died) at one point of publishing its output.

Usage: ``python -m tests.kill_while_publishing JOB POINT FLAGS...``, ``POINT`` one of
:data:`POINTS`: ``plan`` (the list of moves written, nothing moved), ``some_moved`` (half
the files moved), ``all_moved`` (every file moved, the record not written) and ``record``
(the record written, the staging directory not removed).
"""

import os
import sys

from apache_beam.io.filesystems import FileSystems

from beam_jax._src.jobs import output_dir

POINTS = ("plan", "some_moved", "all_moved", "record")
KILLED = 137  # the exit status, as of a SIGKILL


def kill_at(point: str, record_name: str) -> None:
    """Makes this process exit at ``point`` of its next publish (of a job whose record is
    ``record_name``)."""
    write_atomically, rename = output_dir.write_atomically, FileSystems.rename

    def writing(path: str, data: bytes) -> None:
        record = path.endswith(f"/{record_name}")
        if point == "all_moved" and record:
            os._exit(KILLED)
        write_atomically(path, data)
        plan = path.endswith(f"/{output_dir.PUBLISHING}")
        if (point == "plan" and plan) or (point == "record" and record):
            os._exit(KILLED)

    def renaming(sources: list[str], destinations: list[str]) -> None:
        if point == "some_moved" and len(sources) > 1:  # the publish's moves, not a file's
            half = len(sources) // 2
            rename(sources[:half], destinations[:half])
            os._exit(KILLED)
        rename(sources, destinations)

    output_dir.write_atomically = writing
    FileSystems.rename = renaming


if __name__ == "__main__":
    if sys.argv[1] == "curate":
        from pipelines.curate import job
        from pipelines.curate.job import RECORD
    else:
        from pipelines.embed import job
        from pipelines.embed.write import RECORD
    kill_at(sys.argv[2], RECORD)
    job.run(sys.argv[3:])
    sys.exit("the run was not killed while publishing")
