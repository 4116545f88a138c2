"""The contenders (herder, `rq worker-pool` with two worker classes), the job they all run,
and how each pool is launched, found and stopped: the same way for all of them; and
`Scenario`, what each scenario (bench_throughput.py, bench_crash.py) runs them with.

herder is reached only through its command line (`herder run`), the command lines of its
processes and its logs, never through its modules, which may move.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from redis import Redis

from bench_base import Findings
from bench_cpu import Noise, cpu_by_role
from bench_procs import Processes, RedisServer, child_env

QUEUE = "herder-bench"
JOB_MODULE = "herder_bench_jobs"
JOB_FUNC = f"{JOB_MODULE}.noop"
JOB_SOURCE = (
    '"""Written by scripts/bench: the job every contender runs."""\n\n\ndef noop():\n    return None\n'
)
HERDER_MIN_UPTIME = 1.0  # herder's default --min-uptime: a worker dying younger than this backs off
# herder's master runs as `python -P -m herder.supervisor`.
HERDER_MASTER_PACKAGE = "herder.supervisor"


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    kind: str  # "herder" or "rq"
    worker_class: str | None = None


HERDER = Contender("herder", "herder", "herder")
RQ_DEFAULT = Contender("rq-default", "rq worker-pool (default class, rq.Worker: fork per job)", "rq")
RQ_SIMPLE = Contender("rq-simple", "rq worker-pool -w rq.worker.SimpleWorker", "rq", "rq.worker.SimpleWorker")
THROUGHPUT_CONTENDERS = [HERDER, RQ_DEFAULT, RQ_SIMPLE]
CRASH_CONTENDERS = [HERDER, RQ_DEFAULT]


def is_herder_master(cmdline: list[str]) -> bool:
    """Whether a command line is `python ... -m herder.supervisor[.<module>] ...`."""
    if "-m" not in cmdline[:-1]:
        return False
    module = cmdline[cmdline.index("-m") + 1]
    return module == HERDER_MASTER_PACKAGE or module.startswith(HERDER_MASTER_PACKAGE + ".")


@dataclass
class Pool:
    contender: Contender
    popen: subprocess.Popen[bytes]
    log_path: Path
    launched_at: float  # time.time() just before the launch

    def master(self) -> psutil.Process | None:
        """The process whose children are the workers."""
        try:
            top = psutil.Process(self.popen.pid)
            if self.contender.kind == "rq":
                return top
            # herder: `herder run` execs into the watchdog, whose child is the master (its
            # other child, if any, is an embedded redis-server).
            for child in top.children():
                with contextlib.suppress(psutil.Error):
                    if is_herder_master(child.cmdline()):
                        return child
        except psutil.NoSuchProcess:
            pass
        return None

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds used so far by (the supervising processes, the workers): herder's
        watchdog and master vs its workers; rq's pool process vs its workers, their work
        horses and the scheduler."""
        master = self.master() if self.contender.kind == "herder" else None
        return cpu_by_role(self.popen.pid, {self.popen.pid} | ({master.pid} if master else set()))


@dataclass
class StopInfo:
    graceful: bool
    seconds: float
    leftovers: int  # processes still alive after the pool's top process exited, killed by us


class Launcher:
    """Starts and stops the pools, every contender with the same workers, queue and job."""

    def __init__(
        self,
        args: argparse.Namespace,
        tmp: Path,
        procs: Processes,
        server: RedisServer,
        herder_src: Path | None,
        findings: Findings,
    ) -> None:
        self.args = args
        self.tmp = tmp
        self.procs = procs
        self.server = server
        self.herder_src = herder_src  # a snapshot of herder's source to run from, if any
        self.findings = findings
        self.bindir = Path(args.bin_dir)
        self.jobdir = tmp / "jobs"
        self.jobdir.mkdir()
        (self.jobdir / f"{JOB_MODULE}.py").write_text(JOB_SOURCE)

    def argv(self, c: Contender) -> list[str]:
        n = str(self.args.workers)
        if c.kind == "herder":
            state = self.tmp / f"state-{time.monotonic_ns()}"
            return [
                str(self.bindir / "herder"),
                "run",
                "--redis-url",
                self.server.url,
                "--workers",
                n,
                "--queue",
                QUEUE,
                "--path",
                str(self.jobdir),
                "--state-dir",
                str(state),
            ]
        argv = [str(self.bindir / "rq"), "worker-pool", "--url", self.server.url, "--num-workers", n]
        argv += ["--path", str(self.jobdir)]
        if c.worker_class:
            argv += ["--worker-class", c.worker_class]
        return [*argv, QUEUE]

    def launch(self, c: Contender, run_name: str) -> Pool:
        """Start `c`'s pool, logging to <tmp>/<run_name>.log."""
        log_path = self.tmp / f"{run_name}.log"
        argv = self.argv(c)
        with open(log_path, "ab") as f:
            f.write(f"$ {shlex.join(argv)}\n".encode())
        launched_at = time.time()
        env = child_env()
        if c.kind == "herder" and self.herder_src:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.herder_src), env.get("PYTHONPATH")]))
        popen = self.procs.start(argv, log_path, env)
        return Pool(c, popen, log_path, launched_at)

    def stop(self, pool: Pool) -> StopInfo:
        """SIGTERM (a graceful stop for both), wait, then kill whatever is left."""
        t0 = time.monotonic()
        graceful = True
        family: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pool.popen.pid)
            family = [top, *top.children(recursive=True)]  # in case an orphan escapes us
        if pool.popen.poll() is None:
            pool.popen.send_signal(signal.SIGTERM)
            try:
                pool.popen.wait(timeout=self.args.stop_timeout)
            except subprocess.TimeoutExpired:
                graceful = False
                self.findings.problems.append(
                    f"{pool.contender.label}: still running {self.args.stop_timeout:g} s after SIGTERM; "
                    f"killed (log: {pool.log_path})"
                )
        seconds = time.monotonic() - t0
        leftovers = self.procs.kill_all(spare={self.server.pid}, extra=family)
        if leftovers and graceful:
            self.findings.problems.append(
                f"{pool.contender.label}: {leftovers} process(es) still alive after it exited on SIGTERM; "
                f"killed (log: {pool.log_path})"
            )
        return StopInfo(graceful, seconds, leftovers)


@dataclass
class Scenario:
    """What a scenario runs with: the options, the private Redis, the launcher of the pools,
    noise control, and the findings it adds to."""

    args: argparse.Namespace
    redis: Redis
    launcher: Launcher
    noise: Noise
    findings: Findings
