"""The host's own bound on worker processes: how many this machine can carry when the user
does not say (`workers_limit`). Standard library only.

A cgroup's CPU quota and memory limit (a container, a Kubernetes pod; herder.common.cgroup)
bound the host's figures: a pod of 1 CPU and 384 MiB on a big host gets 6, not the host's count."""

from __future__ import annotations

import functools
import math
import os

from herder.common import cgroup

# Workers per CPU: a worker needs ~0.3 s of CPU to start (Python, redis, rq), so even a
# host starting all of them at once gives each core ~5 s of start-up work, well inside the
# start timeout; past that a bigger count only queues for the same cores.
WORKERS_PER_CPU = 16
# Memory per worker: an idle worker's RSS is ~35 MiB; 64 MiB leaves room for its job.
MEMORY_PER_WORKER = 64 * 2**20


def _cpus(quota: float | None) -> tuple[int, str]:
    """The CPUs, and a note when the cgroup's CPU quota is what bounds them."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if quota is not None and math.ceil(quota) < cpus:
        return max(1, math.ceil(quota)), f" (cgroup CPU quota {round(quota, 2)})"
    return cpus, ""


def _memory(limit: int | None) -> tuple[int | None, str]:
    """The memory in bytes (None where the platform does not say), and a note when the cgroup's
    memory limit is what bounds it."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        physical = None
    if limit is not None and (physical is None or limit < physical):
        return limit, " (cgroup memory limit)"
    return physical, ""


def host_cpus() -> int:
    """The CPUs this process may run on (a cpuset or taskset narrows it), else all of them;
    at most the cgroup's CPU quota rounded up (at least 1)."""
    return _cpus(cgroup.cpu_limit())[0]


def host_memory() -> int | None:
    """Physical memory in bytes, at most the cgroup's memory limit; None where the platform
    says neither."""
    return _memory(cgroup.memory_limit())[0]


@functools.cache
def default_workers_limit() -> tuple[int, str]:
    """min(16 x CPUs, memory / 64 MiB), at least 1, the cgroup's limits bounding CPUs and
    memory; and how it was reached, naming the cgroup where it bounds a figure."""
    (cpus, cpu_note), (memory, memory_note) = _cpus(cgroup.cpu_limit()), _memory(cgroup.memory_limit())
    by_cpu = WORKERS_PER_CPU * cpus
    how = f"{WORKERS_PER_CPU} x {cpus} CPUs{cpu_note}"
    if memory is None:
        return max(1, by_cpu), how
    by_memory = memory // MEMORY_PER_WORKER
    shown = f"{memory / 2**30:.1f} GiB" if memory >= 2**30 else f"{memory / 2**20:.0f} MiB"
    how = f"min({how}, {shown}{memory_note} / 64 MiB = {by_memory})"
    return max(1, min(by_cpu, by_memory)), how
