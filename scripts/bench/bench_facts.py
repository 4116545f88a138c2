"""What the numbers depend on: the machine, and the versions of everything measured."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
from pathlib import Path

import psutil
import redis
import rq
from redis import Redis

from bench_commands import COMMAND_NAMES
from bench_source import git_state


def machine_facts(conn: Redis, bindir: Path, digest: str) -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    git = git_state()

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    herder_version = version("herder")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "nproc": f"{len(os.sched_getaffinity(0))} (os.cpu_count() {os.cpu_count()})",
        "CPU": cpu,
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "OS": platform.platform(),
        "Python": f"{platform.python_version()} ({sys.executable})",
        "rq": rq.__version__,
        "redis-py": redis.__version__,
        "redis-server": str(conn.info("server")["redis_version"]),
        "psutil": psutil.__version__,
        "supervisor (supervisord)": version("supervisor"),
        "herder": f"{herder_version}, git {git}, source digest {digest}",
        "commands": ", ".join(str(bindir / name) for name in COMMAND_NAMES),
        "load average at start": load,
    }
