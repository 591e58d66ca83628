"""The CPUs this process may use (the count that sizes its background thread pools), and
what ``/proc/cpuinfo`` says of them."""

from __future__ import annotations

import os

__all__ = ["CPUINFO", "cpuinfo_field", "usable_cores"]

CPUINFO = "/proc/cpuinfo"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, e.g. a
    container's or ``taskset``'s cores; else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpuinfo_field(name: str, path: str = CPUINFO) -> str:
    """The first ``name : value`` line's value in ``path`` ("" where there is none, or no
    such file: not Linux)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""
