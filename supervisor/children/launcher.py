"""The master's seam to the operating system and the clock (supervisord's `options`).

The reconcile loop starts workers only through a Launcher and reads time only through a
Clock, so unit tests give it fakes and run reap, murder, backoff and rolling restarts in
milliseconds (tests/test_master_unit.py, with tests/fakes.py); the end-to-end tests use these real ones.
Also here: the command line and environment a worker starts with.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Protocol

from herder.common import worker_protocol as wp
from herder.common.config import ENV_RESOLVED, Config
from herder.common.doorbell import ENV_DOORBELL
from herder.supervisor.children import pipes
from herder.supervisor.children.fleet import ProcessHandle
from herder.supervisor.children.workerproc import WorkerProcess


class Clock(Protocol):
    """Monotonic time for deadlines, wall time for what other hosts must agree on (SystemClock
    is the real one; unit tests advance a fake)."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class Launcher(Protocol):
    """Where workers come from: SubprocessLauncher, forkserver.ForkServerLauncher; unit tests
    use a fake that spawns fake processes. A launcher with no template to look after takes the
    do-nothing tend, renew and close below by naming this protocol as its base."""

    def spawn(
        self, argv: list[str], env: dict[str, str], slot: int, wake: Callable[[], None]
    ) -> ProcessHandle:
        """Start a worker (raise OSError if it cannot start)."""
        ...

    def warming(self) -> bool:
        """True while spawns should wait (a warm template is being built)."""
        ...

    def tend(self, wake: Callable[[], None]) -> None:
        """Housekeeping each loop pass (the template's life, reaping strays)."""
        return None

    def renew(self, cfg: Config) -> None:
        """A rolling restart begins: new workers must start from new code and settings."""
        return None

    def close(self) -> None:
        return None


class SubprocessLauncher(Launcher):
    """Every worker a new interpreter (--no-fork-server; herder.supervisor.children.forkserver has
    the default, warm one)."""

    def spawn(
        self, argv: list[str], env: dict[str, str], slot: int, wake: Callable[[], None]
    ) -> ProcessHandle:
        return WorkerProcess.spawn(argv, env, slot, wake)

    def warming(self) -> bool:
        return False


def worker_argv(cfg: Config) -> list[str]:
    """herder's own RQ worker (it reads the Config from its environment), or the user's."""
    if cfg.worker_command:
        return list(cfg.worker_command)
    return [sys.executable, "-P", "-m", "herder.worker"]


def worker_env(
    cfg: Config, slot: int, pool: str = "default", jobs_limit: int | None = None
) -> dict[str, str]:
    """A worker's spec: the resolved Config (its pool's), handed over at its start and never
    left in its environment (herder.common.handover), and the documented HERDER_* variables;
    the Redis URL among them only for a --worker-command program, which may not read the
    config (a command that runs herder's own worker does: docs/protocol.md, "Environment").
    `jobs_limit`: the most jobs it takes (max_jobs plus its jitter draw, retirement.py)."""
    env = dict(os.environ)
    env.pop(wp.ENV_JOBS_LIMIT, None)
    if jobs_limit is not None:
        env[wp.ENV_JOBS_LIMIT] = str(jobs_limit)
    env[ENV_RESOLVED] = cfg.to_json()
    env.update(
        {
            wp.ENV_SLOT: str(slot),
            wp.ENV_POOL: pool,
            wp.ENV_QUEUES: ",".join(cfg.queues),
            wp.ENV_HEARTBEAT_INTERVAL: f"{cfg.heartbeat_interval:g}",
            wp.ENV_PROTOCOL_VERSION: str(wp.VERSION),
            "PYTHONUNBUFFERED": "1",
        }
    )
    if cfg.redis_url and cfg.worker_command:
        env[wp.ENV_REDIS_URL] = cfg.redis_url
    env.pop(ENV_DOORBELL, None)  # a master's own, from a master that started this one: not ours
    if not cfg.worker_command and (bell := pipes.doorbell_name(cfg.state_dir)):
        env[ENV_DOORBELL] = bell
    return env
