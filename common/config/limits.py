"""The host's own bound on worker processes: how many this machine can carry when the user
does not say (`workers_limit`). Standard library only."""

from __future__ import annotations

import functools
import os

# Workers per CPU: a worker needs ~0.3 s of CPU to start (Python, redis, rq), so even a
# host starting all of them at once gives each core ~5 s of start-up work, well inside the
# start timeout; past that a bigger count only queues for the same cores.
WORKERS_PER_CPU = 16
# Memory per worker: an idle worker's RSS is ~35 MiB; 64 MiB leaves room for its job.
MEMORY_PER_WORKER = 64 * 2**20


def host_cpus() -> int:
    """The CPUs this process may run on (a cpuset or taskset narrows it), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def host_memory() -> int | None:
    """Physical memory in bytes, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def default_workers_limit() -> tuple[int, str]:
    """min(16 x CPUs, physical memory / 64 MiB), at least 1; and how it was reached."""
    cpus, memory = host_cpus(), host_memory()
    by_cpu = WORKERS_PER_CPU * cpus
    how = f"{WORKERS_PER_CPU} x {cpus} CPUs"
    if memory is None:
        return max(1, by_cpu), how
    by_memory = memory // MEMORY_PER_WORKER
    how = f"min({how}, {memory / 2**30:.1f} GiB / 64 MiB = {by_memory})"
    return max(1, min(by_cpu, by_memory)), how
