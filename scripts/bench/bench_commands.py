"""The one place the bench spells out how its contenders are started: `herder run` (and herder's
other commands), `rq worker-pool`, `rq worker` and supervisord's configuration; and how herder's
master is told apart among a pool's processes. Every scenario builds its command lines here.

herder is reached only through its command line, the command lines of its processes and its
logs, never through its modules, which may move.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import psutil

BIN = Path(sys.executable).parent  # `herder` and `rq`, installed next to the bench's own Python
COMMAND_NAMES = ("herder", "rq", "supervisord")  # what the contenders run, all in BIN (or --bin-dir)
# herder's master runs as `python -P -m herder.supervisor`: how a pool's master is recognised.
HERDER_MASTER_MODULE = "herder.supervisor"
# supervisord's default. A process that exits sooner is a failed start (BACKOFF, then FATAL
# after startretries): the counterpart of herder's --min-uptime. supervisord moves a process
# from STARTING to RUNNING on the first pass of its loop after startsecs, and that loop
# sleeps up to 1 s in poll(), so a worker is surely RUNNING only startsecs + 1 s after spawn.
SUPERVISORD_STARTSECS = 1
SUPERVISORD_LOOP = 1.0


def herder_argv(
    url: str,
    *,
    bindir: Path = BIN,
    workers: int | None = None,
    threads: int | None = None,
    queue: str | None = None,
    path: Path | None = None,
    state_dir: Path | None = None,
    workers_limit: int | None = None,
    scheduler: bool = True,
    http: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """`herder run` on the Redis at `url`; an option left at None is left to herder's default."""
    argv = [str(bindir / "herder"), "run", "--redis-url", url]
    for flag, value in (
        ("--workers", workers),
        ("--threads", threads),
        ("--queue", queue),
        ("--path", path),
        ("--state-dir", state_dir),
        ("--workers-limit", workers_limit),
        ("--http", http),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if not scheduler:
        argv.append("--no-scheduler")
    return [*argv, *extra]


def herder_ctl_argv(state_dir: Path, *argv: str, bindir: Path = BIN) -> list[str]:
    """One of herder's other commands for the herder whose state is in `state_dir`, e.g.
    `herder scale 3` or `herder status --json`."""
    return [str(bindir / "herder"), *argv, "--state-dir", str(state_dir)]


def herder_has_flag(flag: str, env: dict[str, str], bindir: Path = BIN) -> bool:
    """Whether `herder run --help` mentions `flag`."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [str(bindir / "herder"), "run", "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        return flag in out.stdout
    return False


def rq_pool_argv(
    url: str, *, workers: int, queue: str, path: Path, worker_class: str | None = None, bindir: Path = BIN
) -> list[str]:
    """`rq worker-pool` of `workers` workers (its default class unless `worker_class`)."""
    argv = [
        str(bindir / "rq"),
        "worker-pool",
        "--url",
        url,
        "--num-workers",
        str(workers),
        "--path",
        str(path),
    ]
    if worker_class:
        argv += ["--worker-class", worker_class]
    return [*argv, queue]


def rq_worker_argv(
    url: str, *, queue: str, path: Path, worker_class: str | None = None, bindir: Path = BIN
) -> list[str]:
    """One `rq worker`, as supervisord runs it. --with-scheduler: rq worker-pool runs its workers
    with the scheduler on, and herder runs one, so every contender has one."""
    argv = [str(bindir / "rq"), "worker", "--url", url, "-w", worker_class or "rq.Worker"]
    return [*argv, "--path", str(path), "--with-scheduler", queue]


def supervisord_argv(conf: Path, bindir: Path = BIN) -> list[str]:
    return [str(bindir / "supervisord"), "-n", "-c", str(conf)]


def supervisord_conf(
    worker_argv: list[str], *, size: int, tmp: Path, run_name: str, stop_timeout: float
) -> str:
    """A supervisord.conf: one [program] of `size` copies of `worker_argv`, their output appended
    to <tmp>/<run_name>.log. No [unix_http_server]: nothing talks to it."""
    lines = [
        "; written by scripts/bench",
        "[supervisord]",
        "nodaemon=true",
        f"logfile={tmp / f'supervisord-{run_name}.log'}",
        f"pidfile={tmp / f'supervisord-{run_name}.pid'}",
        f"childlogdir={tmp}",
        *(["user=root"] if os.geteuid() == 0 else []),  # as root, it warns unless told so
        "",
        "[program:rqworker]",
        f"command={shlex.join(worker_argv).replace('%', '%%')}",
        f"numprocs={size}",
        "process_name=%(program_name)s_%(process_num)02d",
        "autostart=true",
        "autorestart=true",
        f"startsecs={SUPERVISORD_STARTSECS}",
        "stopsignal=TERM",
        f"stopwaitsecs={stop_timeout:g}",
        "redirect_stderr=true",
        f"stdout_logfile={tmp / f'{run_name}.log'}",
        "stdout_logfile_maxbytes=0",
        "stdout_logfile_backups=0",
    ]
    return "\n".join(lines) + "\n"


def is_herder_master(cmdline: list[str]) -> bool:
    """Whether a command line is `python ... -m herder.supervisor[.<module>] ...`."""
    if "-m" not in cmdline[:-1]:
        return False
    module = cmdline[cmdline.index("-m") + 1]
    return module == HERDER_MASTER_MODULE or module.startswith(HERDER_MASTER_MODULE + ".")


def herder_master(top_pid: int) -> psutil.Process | None:
    """herder's master under `herder run`'s process (which execs into the watchdog, whose child
    is the master; its other child, if any, is an embedded redis-server); None if not found."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(top_pid).children():
            with contextlib.suppress(psutil.Error):
                if is_herder_master(child.cmdline()):
                    return child
    return None
