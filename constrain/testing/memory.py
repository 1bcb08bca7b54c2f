"""A process's memory as Linux reports it, for tests and benchmarks that bound or measure it."""

from __future__ import annotations


def status_mib(field: str = "VmRSS", pid: int | str = "self") -> float | None:
    """One memory figure of a process from ``/proc/<pid>/status``, in MiB: ``VmRSS`` (resident), ``VmHWM`` (its
    high-water mark), ``RssAnon`` (the resident memory it allocated, without the pages of files it maps)...; None
    where there is no such file or field (not Linux, a process that has ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
