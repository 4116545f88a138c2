"""The contenders (herder, with and without its fork server; `rq worker-pool` with two worker
classes; supervisord running `rq worker` processes), the job they all run, and how each pool
is launched, found and stopped: the same way for all of them; and `Scenario`, what each
scenario (bench_throughput.py, bench_crash.py, bench_idle.py, bench_scaling.py) runs them with
(bench_floor.py's floor is no contender: it runs its own processes, in the throughput rounds).
The command lines themselves are bench_commands.py's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import psutil
from redis import Redis
from rq import Worker
from rq.worker_registration import REDIS_WORKER_KEYS

from bench_base import BenchError, Findings, say, wait_for
from bench_commands import (
    SUPERVISORD_LOOP,
    SUPERVISORD_STARTSECS,
    herder_argv,
    herder_ctl_argv,
    herder_has_flag,
    herder_master,
    rq_pool_argv,
    rq_worker_argv,
    supervisord_argv,
    supervisord_conf,
)
from bench_cpu import Noise, cpu_by_role
from bench_procs import Processes, RedisServer, child_env

T = TypeVar("T")
QUEUE = "herder-bench"
JOB_MODULE = "herder_bench_jobs"
JOB_FUNC = f"{JOB_MODULE}.noop"
NOISY_FUNC = f"{JOB_MODULE}.noisy"
JOB_SOURCE = (
    '"""Written by scripts/bench: the job every contender runs."""\n\nimport sys\n\n\ndef noop():\n'
    "    return None\n\n\ndef noisy():\n"
    '    """The noisy load of the crash test: a job that prints, as many do."""\n'
    "    for i in range(20):\n"
    "        print('a line on stdout', i)\n"
    "        print('a line on stderr', i, file=sys.stderr)\n"
)
HERDER_MIN_UPTIME = 1.0  # herder's default --min-uptime: a worker dying younger than this backs off


@dataclass(frozen=True)
class Contender:
    key: str
    label: str
    kind: str  # "herder", "rq" (rq worker-pool) or "supervisord" (supervisord + rq worker)
    worker_class: str | None = None
    herder_flags: tuple[str, ...] = ()  # for herder: flags that make this variant

    @property
    def is_herder(self) -> bool:
        return self.kind == "herder"


HERDER = Contender("herder", "herder", "herder")
HERDER_NOFORK = Contender("herder-nofork", "herder --no-fork-server", "herder", None, ("--no-fork-server",))
RQ_DEFAULT = Contender("rq-default", "rq worker-pool (default class, rq.Worker: fork per job)", "rq")
RQ_SIMPLE = Contender("rq-simple", "rq worker-pool -w rq.worker.SimpleWorker", "rq", "rq.worker.SimpleWorker")
SUPERVISORD = Contender(
    "supervisord",
    "supervisord + rq worker -w rq.worker.SimpleWorker",
    "supervisord",
    "rq.worker.SimpleWorker",
)
ALL_CONTENDERS = [HERDER, HERDER_NOFORK, RQ_DEFAULT, RQ_SIMPLE, SUPERVISORD]
BY_KEY = {c.key: c for c in ALL_CONTENDERS}
PEERS = [RQ_DEFAULT, RQ_SIMPLE, SUPERVISORD]


def registered_pids(conn: Redis) -> set[int]:
    """The pids of the workers in RQ's worker registry (`rq.Worker.all()`)."""
    return {w.pid for w in Worker.all(connection=conn) if w.pid}


class ListingWatch:
    """When RQ lists a new worker, without polling: Redis's keyspace notifications of the set
    `rq.Worker.all()` reads (`rq:workers`; a worker enters it in the MULTI/EXEC that writes its
    hash). The bench reads the `sadd` message as it arrives, then which name is new."""

    def __init__(self, conn: Redis) -> None:
        self.conn = conn
        conn.config_set("notify-keyspace-events", "Ks")
        db = conn.connection_pool.connection_kwargs.get("db", 0)
        self.pubsub = conn.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(f"__keyspace@{db}__:{Worker.redis_workers_keys}")

    def drain(self) -> set[bytes]:
        """Forget what was said so far; the names listed now."""
        while self.pubsub.get_message(timeout=0):
            pass
        return set(self.conn.smembers(Worker.redis_workers_keys))

    def wait_new(self, before: set[bytes], t0: float, timeout: float) -> tuple[bytes, float] | None:
        """(the first name listed that is not in `before`, perf_counter seconds since t0)."""
        while time.perf_counter() - t0 < timeout:
            msg = self.pubsub.get_message(timeout=max(0.0, timeout - (time.perf_counter() - t0)))
            if msg is None or msg.get("data") != b"sadd":
                continue
            at = time.perf_counter() - t0
            fresh = set(self.conn.smembers(Worker.redis_workers_keys)) - before
            if fresh:
                return min(fresh), at
        return None

    def close(self) -> None:
        self.pubsub.close()


def wait_registered(
    conn: Redis, count: int, popen: subprocess.Popen[bytes], log_path: Path, timeout: float
) -> None:
    """Until RQ lists `count` workers (`rq.Worker.all()`); a pool that exits meanwhile fails."""

    def registered() -> bool | None:
        if popen.poll() is not None:
            raise BenchError(f"exited ({popen.returncode}) while starting; see {log_path}")
        return len(Worker.all(connection=conn)) >= count or None

    wait_for(f"{count} RQ workers registered", registered, timeout, 0.2)


def first_job_taken(conn: Redis, key: bytes, t0: float, timeout: float, poll: float) -> float:
    """perf_counter seconds since t0 until the worker hash at `key` shows it took a job (busy,
    or a job counted), polled every `poll` s; NaN if not within `timeout`."""
    while time.perf_counter() - t0 < timeout:
        state, ok, failed = conn.hmget(key, "state", "successful_job_count", "failed_job_count")
        if state == b"busy" or int(ok or 0) or int(failed or 0):
            return time.perf_counter() - t0
        time.sleep(poll)
    return float("nan")


@dataclass
class Pool:
    contender: Contender
    popen: subprocess.Popen[bytes]
    log_path: Path
    launched_at: float  # time.time() just before the launch
    launched_mono: float  # time.monotonic() at the same moment
    size: int  # workers asked for
    state_dir: Path | None = None  # herder's, for `herder scale`
    _master: psutil.Process | None = field(default=None, repr=False)

    def master(self) -> psutil.Process | None:
        """The process whose children are the workers: herder's master, rq's pool process,
        supervisord."""
        if self._master is not None and self._master.is_running():
            return self._master
        self._master = None
        if self.contender.is_herder:
            self._master = herder_master(self.popen.pid)
        else:
            with contextlib.suppress(psutil.NoSuchProcess):
                self._master = psutil.Process(self.popen.pid)
        return self._master

    def workers(self, conn: Redis) -> dict[int, psutil.Process]:
        """The live children of the master that are registered in RQ: the workers. (herder's
        master has two more children, its fork server's template and its scheduler; rq's
        scheduler runs under one of the workers.)"""
        master = self.master()
        if master is None:
            return {}
        found = {}
        with contextlib.suppress(psutil.Error):
            kids = master.children()
            registered = registered_pids(conn)
            for p in kids:
                with contextlib.suppress(psutil.Error):
                    if p.pid in registered and p.status() != psutil.STATUS_ZOMBIE:
                        found[p.pid] = p
        return found

    def wait_ready(self, conn: Redis, timeout: float, interval: float = 0.02) -> dict[int, psutil.Process]:
        """Until all `size` workers are live children of the master and registered in RQ."""

        def full() -> dict[int, psutil.Process] | None:
            if self.popen.poll() is not None:
                raise BenchError(f"exited ({self.popen.returncode}) while starting; see {self.log_path}")
            # The count first, one O(1) call: the full check (every worker's hash, every
            # child's /proc) costs tens of ms at 256 workers, and made every 20 ms it took a
            # core from the pool it timed.
            if conn.scard(REDIS_WORKER_KEYS) < self.size:
                return None
            kids = self.workers(conn)
            return kids if len(kids) >= self.size else None

        return wait_for(f"{self.size} registered workers", full, timeout=timeout, interval=interval)

    def cpu_split(self) -> tuple[float, float]:
        """CPU seconds used so far by (the supervising processes, the workers): herder's
        watchdog and master vs its workers (with its template and scheduler); rq's pool
        process or supervisord vs its workers, their work horses and rq's scheduler."""
        master = self.master() if self.contender.is_herder else None
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
        self.herder_args = shlex.split(args.herder_args or "")
        self.contenders = self.choose(args.contenders)

    def choose(self, wanted: str) -> list[Contender]:
        """The contenders asked for (--contenders) that can run here; a missing one is said."""
        keys = [k.strip() for k in wanted.split(",") if k.strip()]
        chosen = []
        for c in (BY_KEY[k] for k in keys):
            if c is HERDER_NOFORK and not herder_has_flag("--no-fork-server", self.herder_env(), self.bindir):
                self.findings.warnings.append(
                    f"`herder run --help` does not mention --no-fork-server: contender '{c.label}' left out"
                )
                continue
            if c.kind == "supervisord" and not os.access(self.bindir / "supervisord", os.X_OK):
                self.findings.problems.append(
                    f"no `supervisord` in {self.bindir} (pip install supervisor, or the bench extra): "
                    f"contender '{c.label}' left out"
                )
                continue
            chosen.append(c)
        return chosen

    def herder_env(self) -> dict[str, str]:
        env = child_env()
        if self.herder_src:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.herder_src), env.get("PYTHONPATH")]))
        return env

    def min_age(self, c: Contender) -> float:
        """The youngest worker the crash test may kill: past herder's --min-uptime (the
        default --min-age), and for supervisord surely RUNNING (startsecs + one loop pass)."""
        if c.kind == "supervisord":
            return max(self.args.min_age, SUPERVISORD_STARTSECS + SUPERVISORD_LOOP + 0.5)
        return self.args.min_age

    def argv(self, c: Contender, size: int, run_name: str) -> tuple[list[str], Path | None]:
        url, bindir = self.server.url, self.bindir
        if c.is_herder:
            state = self.tmp / f"state-{run_name}"
            argv = herder_argv(
                url,
                bindir=bindir,
                workers=size,
                queue=QUEUE,
                path=self.jobdir,
                state_dir=state,
                # herder caps workers at min(16 x CPUs, memory / 64 MiB) unless told
                workers_limit=size if size > 16 else None,
                extra=[*c.herder_flags, *self.herder_args],
            )
            return argv, state
        if c.kind == "supervisord":
            conf = self.tmp / f"supervisord-{run_name}.conf"
            text = supervisord_conf(
                self.rq_worker_argv(c),
                size=size,
                tmp=self.tmp,
                run_name=run_name,
                stop_timeout=self.args.stop_timeout,
            )
            conf.write_text(text)
            return supervisord_argv(conf, bindir), None
        return rq_pool_argv(
            url, workers=size, queue=QUEUE, path=self.jobdir, worker_class=c.worker_class, bindir=bindir
        ), None

    def rq_worker_argv(self, c: Contender) -> list[str]:
        return rq_worker_argv(
            self.server.url, queue=QUEUE, path=self.jobdir, worker_class=c.worker_class, bindir=self.bindir
        )

    def launch(self, c: Contender, run_name: str, size: int | None = None) -> Pool:
        """Start `c`'s pool of `size` workers (default --workers), logging to <tmp>/<run_name>.log."""
        size = size or self.args.workers
        log_path = self.tmp / f"{run_name}.log"
        argv, state_dir = self.argv(c, size, run_name)
        with open(log_path, "ab") as f:
            f.write(f"$ {shlex.join(argv)}\n".encode())
        env = self.herder_env() if c.is_herder else child_env()
        launched_at, launched_mono = time.time(), time.monotonic()
        popen = self.procs.start(argv, log_path, env)
        return Pool(c, popen, log_path, launched_at, launched_mono, size, state_dir)

    def herder_cli(self, pool: Pool, *argv: str) -> subprocess.CompletedProcess[str]:
        """`herder <argv> --state-dir <pool's>`, e.g. `herder scale 3`."""
        assert pool.state_dir is not None, "herder's pools only"
        return subprocess.run(
            herder_ctl_argv(pool.state_dir, *argv, bindir=self.bindir),
            env=self.herder_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def command(self, c: Contender) -> str:
        """The command line of `c`, for the report (temp paths shortened)."""
        argv, _ = self.argv(c, self.args.workers, "RUN")
        if c.kind == "supervisord":
            argv = [*argv, ";", "program:", *self.rq_worker_argv(c)]
        text = shlex.join(argv).replace(self.server.url, "URL").replace(str(self.tmp), "TMP")
        return text.replace(str(self.bindir) + "/", "")

    def stop(self, pool: Pool) -> StopInfo:
        """SIGTERM (a graceful stop for all of them), wait, then kill whatever is left."""
        t0 = time.monotonic()
        graceful = True
        family: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            top = psutil.Process(pool.popen.pid)
            family = [top, *top.children(recursive=True)]  # in case an orphan escapes us
        if pool.popen.poll() is None:
            pool.popen.send_signal(signal.SIGTERM)
            try:
                pool.popen.wait(timeout=self.args.stop_timeout + 5)
            except subprocess.TimeoutExpired:
                graceful = False
                self.findings.problems.append(
                    f"{pool.contender.label}: still running {self.args.stop_timeout + 5:g} s after SIGTERM; "
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

    def attempt(self, what: str, one_run: Callable[[], T]) -> T | None:
        """One run: what it measured, or None when it failed (a problem in the report, and said
        now); the scenario goes on with the next."""
        try:
            return one_run()
        except BenchError as exc:
            self.findings.problems.append(f"{what}: {exc}")
            say(f"  FAILED: {exc}")
            return None
