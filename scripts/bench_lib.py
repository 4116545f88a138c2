"""The benchmark behind scripts/bench: herder against `rq worker-pool`, on one private Redis.

Two measurements, each at equal worker counts:

* throughput: enqueue N no-op jobs, then start the pool; jobs/s is N over the span from
  the first job's `started_at` to the last job's `ended_at` (RQ's own job timestamps), so
  start-up does not count. Also reported: wall time (pool launch to the last `ended_at`),
  steady-state jobs/s (10% to 90% of the `ended_at`s), and CPU per job split between the
  workers and the supervising processes. Contenders take turns round by round, with the
  Redis DB flushed before every run.
* crash to replacement: with the pool idle, SIGKILL one worker; time until a new child of
  the pool's master process exists (psutil, polled), and until that pid is registered in
  RQ's worker registry (`rq.Worker.all()`, polled). Same method for every contender.

Every process it starts (Redis, the pools and whatever they spawn) is ended in `finally`,
on Ctrl-C and on error as well: the bench makes itself a child subreaper, so even workers
orphaned by a dying pool stay its descendants and are found.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import hashlib
import importlib.metadata
import math
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil
import redis
import rq
from redis import Redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry

T = TypeVar("T")

QUEUE = "herder-bench"
JOB_MODULE = "herder_bench_jobs"
JOB_FUNC = f"{JOB_MODULE}.noop"
JOB_SOURCE = (
    '"""Written by scripts/bench: the job every contender runs."""\n\n\ndef noop():\n    return None\n'
)
REPO = Path(__file__).resolve().parent.parent
PR_SET_CHILD_SUBREAPER = 36
HERDER_MIN_UPTIME = 1.0  # herder's default --min-uptime: a worker dying younger than this backs off

# herder's log lines, e.g. "2026-11-22 02:27:08,264 herder[3798] INFO slot 0 pid 3814: spawned -> starting"
LOG_TS = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) herder\[\d+\] \w+ slot \d+ pid (\d+): "
SPAWNED_RE = re.compile(LOG_TS + r"spawned -> ")
READY_RE = re.compile(LOG_TS + r"starting -> idle \(ready\)")


class BenchError(Exception):
    """One run failed; the benchmark records it and goes on."""


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: unwind like Ctrl-C, through every `finally`."""


def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def p90(xs: list[float]) -> float:
    """Nearest-rank 90th percentile: the 9th of 10 sorted samples."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(0.9 * len(s)) - 1)]


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, interval: float = 0.01) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# ---- contenders -------------------------------------------------------------------------


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


# ---- processes ----------------------------------------------------------------------------


def become_subreaper() -> bool:
    """Orphans of our children (workers of a master that died) get re-parented to us."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def child_env() -> dict[str, str]:
    """Our environment minus herder's and RQ's settings, so nothing leaks into a contender."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("HERDER_", "RQ_"))}


class Processes:
    """Every process the bench starts, and the means to end them all."""

    def __init__(self) -> None:
        self.popens: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], log_path: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as out:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env or child_env(),
                close_fds=True,
                # Its own session: a Ctrl-C at the terminal reaches only the bench, which
                # then ends everything itself, in order.
                start_new_session=True,
            )
        self.popens.append(popen)
        return popen

    def kill_all(self, spare: set[int], extra: Iterable[psutil.Process] = ()) -> int:
        """SIGKILL every descendant of ours (adopted orphans included, as we are a subreaper)
        and its process group, plus `extra`, except the processes in `spare`. Returns how
        many live processes it hit. Exited children are only known by their unreaped pid or
        as psutil objects, so a recycled pid is never signalled."""
        procs: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            for q in psutil.Process().children(recursive=True):
                procs.setdefault(q.pid, q)
        for q in extra:
            with contextlib.suppress(psutil.Error):
                if q.is_running():
                    procs.setdefault(q.pid, q)
                    for k in q.children(recursive=True):
                        procs.setdefault(k.pid, k)
        for pid in spare:
            procs.pop(pid, None)
        spare_groups = set()
        for pid in spare:
            with contextlib.suppress(OSError):
                spare_groups.add(os.getpgid(pid))
        alive = []
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        groups = set()
        for p in alive:
            with contextlib.suppress(OSError):
                groups.add(os.getpgid(p.pid))
        for g in groups - spare_groups - {os.getpgrp(), 0, 1}:
            with contextlib.suppress(OSError):
                os.killpg(g, signal.SIGKILL)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil refuses if the pid was reused by another process
        psutil.wait_procs(alive, timeout=5)
        self.reap(spare)
        return len(alive)

    def reap(self, spare: set[int]) -> None:
        for popen in self.popens:
            if popen.pid not in spare:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=1)
        tracked = {p.pid for p in self.popens}
        for child in psutil.Process().children():
            if child.pid not in tracked and child.pid not in spare:
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(child.pid, os.WNOHANG)  # an adopted orphan's zombie


class RedisServer:
    def __init__(self, binary: str, workdir: Path, procs: Processes) -> None:
        self.binary = binary
        self.workdir = workdir
        self.procs = procs
        self.popen: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else -1

    @staticmethod
    def free_port() -> int:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port != 6379:
                return port

    def start(self) -> Redis:
        for _attempt in range(5):
            self.port = self.free_port()
            argv = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
            argv += ["--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no"]
            self.popen = self.procs.start(argv, self.workdir / "redis-server.log")
            conn = Redis(host="127.0.0.1", port=self.port, db=0)
            deadline = time.monotonic() + 10
            while self.popen.poll() is None and time.monotonic() < deadline:
                try:
                    conn.ping()
                    return conn
                except redis.ConnectionError:
                    time.sleep(0.02)
            self.stop()  # lost the port to someone else, or too slow: try another
        raise BenchError(f"could not start {self.binary}; see {self.workdir / 'redis-server.log'}")

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.terminate()  # redis saves nothing: `--save ''` and no AOF
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


class CpuMeter:
    """CPU time spent by processes that are not ours during an interval, in cores: a noise
    indicator (the bench shares the machine with whatever else runs on it).

    Ours = the bench, its reaped descendants (RUSAGE_CHILDREN: as a subreaper it reaps even
    orphans) and its live descendants (Redis). Pools are stopped and reaped before `stop()`.
    On a virtual machine, `steal` (time the hypervisor gave to other guests) is noise too.
    """

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.busy0, self.ours0, self.steal0 = self._busy(), self._ours(), self._steal()
        self.steal = math.nan  # cores, set by stop()

    @staticmethod
    def _steal() -> float:
        return getattr(psutil.cpu_times(), "steal", 0.0)

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)  # guest is in user
        return total - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "steal", 0.0)

    @staticmethod
    def _ours() -> float:
        used = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            r = resource.getrusage(who)
            used += r.ru_utime + r.ru_stime
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process().children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    c = p.cpu_times()
                    used += c.user + c.system
        return used

    def stop(self) -> float:
        elapsed = time.monotonic() - self.t0
        foreign = (self._busy() - self.busy0) - (self._ours() - self.ours0)
        if elapsed <= 0:
            return math.nan
        self.steal = (self._steal() - self.steal0) / elapsed
        return max(0.0, foreign) / elapsed


# ---- pools --------------------------------------------------------------------------------


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
            # herder: `herder run` execs into the watchdog, whose child is the master.
            for child in top.children():
                with contextlib.suppress(psutil.Error):
                    if "herder.supervisor.master" in child.cmdline():
                        return child
        except psutil.NoSuchProcess:
            pass
        return None


@dataclass
class StopInfo:
    graceful: bool
    seconds: float
    leftovers: int  # processes still alive after the pool's top process exited, killed by us


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path, procs: Processes, server: RedisServer) -> None:
        self.args = args
        self.tmp = tmp
        self.procs = procs
        self.server = server
        self.redis: Redis = server.start()
        self.jobdir = tmp / "jobs"
        self.jobdir.mkdir()
        (self.jobdir / f"{JOB_MODULE}.py").write_text(JOB_SOURCE)
        self.bindir = Path(args.bin_dir)
        self.herder_src = snapshot_herder(tmp / "herder-src") if args.snapshot else None
        self.problems: list[str] = []  # failures, and misbehaviour of a contender
        self.warnings: list[str] = []  # noise
        # When the bench first saw each worker pid, on the monotonic clock: a worker's age.
        # (psutil's create_time is not fit for that: it adds a whole-second boot time.)
        self.first_seen: dict[int, float] = {}
        self.child_polls: list[float] = []  # seconds per poll, of the current crash run
        self.registry_polls: list[float] = []

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

    def launch(self, c: Contender, log_path: Path) -> Pool:
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
                self.problems.append(
                    f"{pool.contender.label}: still running {self.args.stop_timeout:g} s after SIGTERM; "
                    f"killed (log: {pool.log_path})"
                )
        seconds = time.monotonic() - t0
        leftovers = self.procs.kill_all(spare={self.server.pid}, extra=family)
        if leftovers and graceful:
            self.problems.append(
                f"{pool.contender.label}: {leftovers} process(es) still alive after it exited on SIGTERM; "
                f"killed (log: {pool.log_path})"
            )
        return StopInfo(graceful, seconds, leftovers)

    # ---- throughput ------------------------------------------------------------------------

    def enqueue(self, n: int) -> list[str]:
        q = Queue(QUEUE, connection=self.redis)
        ids: list[str] = []
        for start in range(0, n, 500):
            datas = [Queue.prepare_data(JOB_FUNC) for _ in range(min(500, n - start))]
            with self.redis.pipeline() as pipe:
                jobs = q.enqueue_many(datas, pipeline=pipe)
                pipe.execute()
            ids += [j.id for j in jobs]
        if q.count != n:
            raise BenchError(f"enqueued {n} jobs but the queue holds {q.count}")
        return ids

    def throughput_round(self, c: Contender, round_no: int) -> dict:
        n = self.args.jobs
        self.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        ids = self.enqueue(n)
        log_path = self.tmp / f"throughput-{c.key}-{round_no}.log"
        pool = self.launch(c, log_path)
        try:
            finished = FinishedJobRegistry(QUEUE, connection=self.redis)
            failed = FailedJobRegistry(QUEUE, connection=self.redis)
            deadline = time.monotonic() + self.args.round_timeout
            # CPU snapshots at 10% and 90% of the jobs done: steady-state CPU per job, by role.
            marks = [max(1, n // 10), n - n // 10]
            snaps: list[tuple[int, float, float]] = []
            while True:
                done = finished.get_job_count(cleanup=False) + failed.get_job_count(cleanup=False)
                if len(snaps) < 2 and done >= marks[len(snaps)] and n >= 20:
                    snaps.append((done, *self.cpu_split(pool)))
                if done >= n:
                    break
                if pool.popen.poll() is not None:
                    raise BenchError(
                        f"exited ({pool.popen.returncode}) after {done} of {n} jobs; see {log_path}"
                    )
                if time.monotonic() > deadline:
                    raise BenchError(f"only {done} of {n} jobs done after {self.args.round_timeout:g} s")
                time.sleep(0.01)
        finally:
            stop = self.stop(pool)
        starts, ends, by_worker, bad = [], [], Counter(), Counter()
        for i in range(0, n, 500):
            for job in Job.fetch_many(ids[i : i + 500], connection=self.redis):
                if job is None or job.get_status(refresh=False) != JobStatus.FINISHED:
                    bad[job.get_status(refresh=False) if job else "missing"] += 1
                    continue
                starts.append(job.started_at.timestamp())
                ends.append(job.ended_at.timestamp())
                by_worker[job.worker_name] += 1
        if bad:
            raise BenchError(f"{sum(bad.values())} of {n} jobs did not finish: {dict(bad)}; see {log_path}")
        first, last = min(starts), max(ends)
        ends.sort()
        lo, hi = n // 10, n - 1 - n // 10
        steady = (hi - lo) / (ends[hi] - ends[lo]) if ends[hi] > ends[lo] else math.nan
        cpu_sup = cpu_work = math.nan
        if len(snaps) == 2 and snaps[1][0] > snaps[0][0]:
            jobs = snaps[1][0] - snaps[0][0]
            cpu_sup = (snaps[1][1] - snaps[0][1]) / jobs
            cpu_work = (snaps[1][2] - snaps[0][2]) / jobs
        other_load = meter.stop()
        self.check_quiet(other_load, meter.steal, f"throughput, {c.label}, round {round_no}")
        return {
            "other_load": other_load,
            "steal": meter.steal,
            "jobs_per_s": n / (last - first),
            "steady_jobs_per_s": steady,
            "cpu_supervisor": cpu_sup,
            "cpu_workers": cpu_work,
            "span": last - first,
            "wall": last - pool.launched_at,
            "first_job_after": first - pool.launched_at,
            "workers_used": len(by_worker),
            "stop": stop,
        }

    @staticmethod
    def cpu_split(pool: Pool) -> tuple[float, float]:
        """CPU seconds used so far by (the supervising processes, the workers): herder's
        watchdog and master vs its workers; rq's pool process vs its workers, their work
        horses (reaped ones count in the worker's children times) and the scheduler."""
        sup = work = 0.0
        try:
            top = psutil.Process(pool.popen.pid)
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            return math.nan, math.nan
        master = pool.master() if pool.contender.kind == "herder" else None
        sup_pids = {top.pid} | ({master.pid} if master else set())
        for p in tree:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                used = t.user + t.system + t.children_user + t.children_system
                if p.pid in sup_pids:
                    sup += used
                else:
                    work += used
        return sup, work

    def wait_quiet(self) -> None:
        """Before a run: wait (up to --quiet-wait s) for other processes to calm down."""
        deadline = time.monotonic() + self.args.quiet_wait
        said = -math.inf
        while self.args.quiet_wait > 0:
            meter = CpuMeter()
            time.sleep(1.0)
            load = meter.stop()
            if load <= self.args.max_other_load and meter.steal <= self.args.max_other_load:
                return
            if time.monotonic() > deadline:
                say(f"  the machine is still busy ({load:.2f} cores of other processes): going ahead")
                return
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                say(f"  waiting for a quieter machine: other processes use {load:.2f} cores")

    def check_quiet(self, load: float, steal: float, what: str) -> None:
        if steal > self.args.max_other_load:
            self.warnings.append(
                f"{what}: the hypervisor stole {steal:.2f} cores on average during the run "
                f"(over --max-other-load {self.args.max_other_load:g}): its numbers are noisy"
            )
        if load > self.args.max_other_load:
            self.warnings.append(
                f"{what}: other processes used {load:.2f} cores on average during the run "
                f"(over --max-other-load {self.args.max_other_load:g}): its numbers are noisy"
            )

    def throughput(self) -> dict[str, list[dict]]:
        results: dict[str, list[dict]] = {c.key: [] for c in THROUGHPUT_CONTENDERS}
        for r in range(1, self.args.rounds + 1):
            for c in THROUGHPUT_CONTENDERS:  # taking turns spreads any drift over everyone
                say(f"throughput round {r}/{self.args.rounds}: {c.label}, {self.args.jobs} jobs")
                try:
                    res = self.throughput_round(c, r)
                except BenchError as exc:
                    self.problems.append(f"throughput, {c.label}, round {r}: {exc}")
                    say(f"  FAILED: {exc}")
                    continue
                results[c.key].append(res)
                say(
                    f"  {res['jobs_per_s']:.0f} jobs/s over {res['span']:.2f} s "
                    f"(steady {res['steady_jobs_per_s']:.0f}); wall {res['wall']:.2f} s; "
                    f"CPU/job workers {res['cpu_workers'] * 1000:.2f} ms "
                    f"+ supervisor {res['cpu_supervisor'] * 1000:.2f} ms; "
                    f"{res['workers_used']} workers ran jobs; stopped in {res['stop'].seconds:.1f} s; "
                    f"other processes' load {res['other_load']:.2f} cores, steal {res['steal']:.2f}"
                )
        return results

    # ---- crash to replacement -----------------------------------------------------------------

    def live_workers(self, master: psutil.Process) -> dict[int, psutil.Process]:
        found = {}
        now = time.monotonic()
        for p in master.children():
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    found[p.pid] = p
                    self.first_seen.setdefault(p.pid, now)
        return found

    def registered_pids(self) -> set[int]:
        return {w.pid for w in Worker.all(connection=self.redis) if w.pid}

    def wait_full(self, master: psutil.Process) -> dict[int, psutil.Process]:
        """Until the pool has its N workers, each a live child of the master and registered in RQ."""

        def full() -> dict[int, psutil.Process] | None:
            kids = self.live_workers(master)
            if len(kids) == self.args.workers and set(kids) <= self.registered_pids():
                return kids
            return None

        return wait_for(f"{self.args.workers} registered workers", full, timeout=60, interval=0.05)

    def pick_victim(self, master: psutil.Process) -> psutil.Process:
        """The oldest worker with no children of its own (rq's scheduler process lives under
        one of its workers), and old enough that herder's crash-loop backoff (for workers
        dying within --min-uptime of their spawn) does not apply."""

        def eligible() -> psutil.Process | None:
            now = time.monotonic()
            found = []
            for p in self.live_workers(master).values():
                with contextlib.suppress(psutil.Error):
                    born = self.first_seen[p.pid]
                    if not p.children() and now - born >= self.args.min_age:
                        found.append((born, p.pid, p))
            return min(found)[2] if found else None

        return wait_for("a worker to kill", eligible, timeout=30, interval=0.05)

    def crash_run(self, c: Contender) -> dict:
        self.wait_quiet()
        meter = CpuMeter()
        self.redis.flushdb()
        log_path = self.tmp / f"crash-{c.key}.log"
        pool = self.launch(c, log_path)
        samples: list[dict] = []
        try:
            master = wait_for("the pool's master process", pool.master, timeout=30)
            samples = self.kill_loop(master)
        except psutil.NoSuchProcess as exc:
            raise BenchError(f"the pool's master process is gone ({exc}); see {log_path}") from exc
        finally:
            stop = self.stop(pool)
        other_load = meter.stop()
        self.check_quiet(other_load, meter.steal, f"crash test, {c.label}")
        result = {
            "other_load": other_load,
            "steal": meter.steal,
            "spawn": [s["spawn"] for s in samples],
            "ready": [s["ready"] for s in samples],
            "child_poll_ms": median(self.child_polls) * 1000,
            "registry_poll_ms": median(self.registry_polls) * 1000,
            "stop": stop,
        }
        if c.kind == "herder":
            result.update(herder_log_times(log_path, samples, self.problems))
        return result

    def kill_loop(self, master: psutil.Process) -> list[dict]:
        samples: list[dict] = []
        poll = self.args.poll_interval
        child_polls, registry_polls = self.child_polls, self.registry_polls = [], []
        self.first_seen = {}
        self.wait_full(master)
        for k in range(1, self.args.kills + 1):
            time.sleep(self.args.settle)
            victim = self.pick_victim(master)
            before = {p.pid for p in master.children()} | {victim.pid}
            kill_wall = time.time()
            t0 = time.perf_counter()
            os.kill(victim.pid, signal.SIGKILL)
            new_pid, t_spawn = None, math.nan
            while time.perf_counter() - t0 < 30:
                a = time.perf_counter()
                fresh = {p.pid for p in master.children()} - before
                child_polls.append(time.perf_counter() - a)
                if fresh:
                    t_spawn = time.perf_counter() - t0
                    new_pid = min(fresh)
                    self.first_seen[new_pid] = time.monotonic()
                    break
                time.sleep(poll)
            if new_pid is None:
                raise BenchError(f"kill {k}: no replacement process within 30 s")
            t_ready = math.nan
            while time.perf_counter() - t0 < 60:
                a = time.perf_counter()
                registered = self.registered_pids()
                registry_polls.append(time.perf_counter() - a)
                if new_pid in registered:
                    t_ready = time.perf_counter() - t0
                    break
                time.sleep(poll)
            if math.isnan(t_ready):
                raise BenchError(f"kill {k}: replacement pid {new_pid} not in RQ's registry within 60 s")
            samples.append(
                {
                    "victim": victim.pid,
                    "new": new_pid,
                    "spawn": t_spawn,
                    "ready": t_ready,
                    "kill_wall": kill_wall,
                }
            )
            say(
                f"  kill {k}/{self.args.kills}: pid {victim.pid} -> {new_pid}: "
                f"spawned {t_spawn * 1000:.1f} ms, registered {t_ready * 1000:.1f} ms"
            )
            self.wait_full(master)
        # Before the stop, let the last replacement finish starting: a worker that rq's pool
        # forked installs its own signal handlers only after it registers, and a SIGINT in
        # between runs the pool's inherited handler instead, so that worker never stops.
        time.sleep(self.args.settle)
        return samples

    def crash(self) -> dict[str, dict]:
        results = {}
        for c in CRASH_CONTENDERS:
            say(f"crash to replacement: {c.label}, {self.args.kills} kills")
            try:
                results[c.key] = self.crash_run(c)
            except BenchError as exc:
                self.problems.append(f"crash test, {c.label}: {exc}")
                say(f"  FAILED: {exc}")
        return results


def herder_log_times(log_path: Path, samples: list[dict], problems: list[str]) -> dict:
    """Cross-check from herder's own log: its `spawned` and `ready` lines for each new pid.
    asctime has millisecond resolution (truncated), in local time."""

    def stamp(text: str) -> float:
        return dt.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()

    spawned, ready = {}, {}
    for line in log_path.read_text(errors="replace").splitlines():
        if m := SPAWNED_RE.match(line):
            spawned[int(m[2])] = stamp(m[1])
        elif m := READY_RE.match(line):
            ready[int(m[2])] = stamp(m[1])
    log_spawn, log_ready = [], []
    for s in samples:
        if s["new"] in spawned and s["new"] in ready:
            log_spawn.append(spawned[s["new"]] - s["kill_wall"])
            log_ready.append(ready[s["new"]] - s["kill_wall"])
        else:
            problems.append(f"herder's log has no spawned/ready line for replacement pid {s['new']}")
    return {"log_spawn": log_spawn, "log_ready": log_ready}


# ---- the report ---------------------------------------------------------------------------------


HERDER_PACKAGES = ("supervisor", "worker", "watchdog")


def herder_digest(root: Path = REPO) -> str:
    """A digest of herder's source, to notice the code changing under a run."""
    h = hashlib.sha256()
    for pkg in HERDER_PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            with contextlib.suppress(OSError):
                h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def snapshot_herder(dest: Path) -> Path:
    """Copy herder's packages, so that edits to the working tree during a run (herder is
    installed in editable mode) cannot change the code being measured. The copy comes
    first on PYTHONPATH for herder's processes, ahead of the editable install's finder."""
    for pkg in HERDER_PACKAGES:
        shutil.copytree(REPO / pkg, dest / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = child_env()
    env["PYTHONPATH"] = str(dest)
    probe = (
        "import herder.supervisor.ctl.cli, herder.supervisor.master, herder.worker.rq_worker, "
        "herder.watchdog.core as m; print(m.__file__)"
    )
    where = subprocess.run(
        [sys.executable, "-P", "-c", probe], env=env, capture_output=True, text=True, check=False
    )
    if where.returncode != 0 or not where.stdout.strip().startswith(str(dest)):
        raise BenchError(f"the snapshot of herder in {dest} does not import: {where.stderr.strip()[-500:]}")
    return dest


def machine_facts(conn: Redis, bindir: Path, digest: str) -> dict[str, str]:
    """What the numbers depend on: the machine, and the versions of everything measured."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    git = "unknown"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        rev = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "supervisor", "worker", "watchdog"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        git = rev + (" (herder's code modified)" if dirty else "")
    try:
        herder_version = importlib.metadata.version("herder")
    except importlib.metadata.PackageNotFoundError:
        herder_version = "not installed"
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
        "herder": f"{herder_version}, git {git}, source digest {digest}",
        "commands": f"{bindir / 'herder'}, {bindir / 'rq'}",
        "load average at start": load,
    }


def fmt_ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def fmt_ms(x: float) -> str:
    return "n/a" if math.isnan(x) else (f"{x * 1000:.1f} ms" if x < 10 else f"{x:.2f} s")


def render(
    args: argparse.Namespace,
    command: str,
    facts: dict,
    thr: dict,
    crash: dict,
    problems: list[str],
    warnings: list[str],
) -> str:
    out = ["# herder benchmark", ""]
    out += [f"Command: `{command}`", ""]
    out += [f"Run at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", ""]
    out += ["| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in facts.items()]
    out.append("")

    med_jps: dict[str, float] = {}
    if thr:
        out += [
            f"## Throughput: {args.jobs} no-op jobs, {args.workers} workers, median of {args.rounds} rounds",
            "",
            "jobs/s = jobs / (last job's `ended_at` - first job's `started_at`); "
            "wall = pool launch to the last `ended_at`; steady = jobs/s between the 10% and the 90% "
            "`ended_at`; CPU per job = CPU time used between 10% and 90% of jobs done (psutil), "
            "split into the workers (with rq's fork-per-job work horses) and the supervising processes "
            "(herder's watchdog + master; rq's pool process). All medians over the rounds.",
            "",
            "| contender | jobs/s (median) | jobs/s per round | wall s (median) "
            "| first job after launch | steady jobs/s, 10-90% | CPU ms/job: workers + supervisor "
            "| noise, cores: other processes + steal (max) |",
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for c in THROUGHPUT_CONTENDERS:
            rs = thr.get(c.key, [])
            med_jps[c.key] = median([r["jobs_per_s"] for r in rs])
            per_round = ", ".join(f"{r['jobs_per_s']:.0f}" for r in rs) or "failed"
            wall = median([r["wall"] for r in rs])
            first = median([r["first_job_after"] for r in rs])
            load = max([r["other_load"] for r in rs], default=math.nan)
            steal = max([r["steal"] for r in rs], default=math.nan)
            steady = median([r["steady_jobs_per_s"] for r in rs])
            cpu_w = median([r["cpu_workers"] for r in rs]) * 1000
            cpu_s = median([r["cpu_supervisor"] for r in rs]) * 1000
            out.append(
                f"| {c.label} | {med_jps[c.key]:.0f} | {per_round} | {wall:.2f} | {fmt_ms(first)} "
                f"| {steady:.0f} | {cpu_w:.2f} + {cpu_s:.2f} | {load:.2f} + {steal:.2f} |"
            )
        med_wall = {c.key: median([r["wall"] for r in thr.get(c.key, [])]) for c in THROUGHPUT_CONTENDERS}
        out += [
            "",
            "| ratio | jobs/s (higher is better for herder) | wall time (lower is better for herder) |",
        ]
        out += ["|---|---:|---:|"]
        for other in (RQ_DEFAULT, RQ_SIMPLE):
            out.append(
                f"| herder / {other.label} | {fmt_ratio(med_jps['herder'] / med_jps[other.key])} "
                f"| {fmt_ratio(med_wall['herder'] / med_wall[other.key])} |"
            )
        out.append("")

    if crash:
        out += [
            f"## Crash to replacement: SIGKILL one idle worker of {args.workers}, {args.kills} kills",
            "",
            "spawned = until a new child of the pool's master exists (psutil, polled every "
            f"{args.poll_interval * 1000:g} ms); registered = until that pid is in `rq.Worker.all()` (polled "
            "likewise). Both from just before the `kill -9`.",
            "",
            "| contender | spawned median | spawned p90 | registered (ready) median | registered p90 "
            "| noise, cores: other processes + steal |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c in CRASH_CONTENDERS:
            r = crash.get(c.key)
            if not r:
                out.append(f"| {c.label} | failed | | | | |")
                continue
            out.append(
                f"| {c.label} | {fmt_ms(median(r['spawn']))} | {fmt_ms(p90(r['spawn']))} "
                f"| {fmt_ms(median(r['ready']))} | {fmt_ms(p90(r['ready']))} "
                f"| {r['other_load']:.2f} + {r['steal']:.2f} |"
            )
        h, d = crash.get(HERDER.key), crash.get(RQ_DEFAULT.key)
        if h and h.get("log_spawn"):
            out.append(
                f"| herder, from its own log lines (`spawned`, `starting -> idle (ready)`; 1 ms resolution) "
                f"| {fmt_ms(median(h['log_spawn']))} | {fmt_ms(p90(h['log_spawn']))} "
                f"| {fmt_ms(median(h['log_ready']))} | {fmt_ms(p90(h['log_ready']))} | |"
            )
        if h and d:
            out.append(
                f"| ratio herder / rq worker-pool (lower is better for herder) "
                f"| {fmt_ratio(median(h['spawn']) / median(d['spawn']))} "
                f"| {fmt_ratio(p90(h['spawn']) / p90(d['spawn']))} "
                f"| {fmt_ratio(median(h['ready']) / median(d['ready']))} "
                f"| {fmt_ratio(p90(h['ready']) / p90(d['ready']))} | |"
            )
        polls = "; ".join(
            f"{c.label}: children() {crash[c.key]['child_poll_ms']:.2f} ms, "
            f"Worker.all() {crash[c.key]['registry_poll_ms']:.2f} ms"
            for c in CRASH_CONTENDERS
            if c.key in crash
        )
        out += ["", f"Median cost of one poll (adds to the resolution): {polls}.", ""]

    out += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    h = crash.get(HERDER.key)
    if h:
        m = median(h["spawn"])
        out.append(
            f"| herder replacement spawned in under 50 ms (median) | {fmt_ms(m)} | {yn(m, m < 0.050)} |"
        )
    if med_jps:
        r1 = med_jps["herder"] / med_jps[RQ_DEFAULT.key]
        r2 = med_jps["herder"] / med_jps[RQ_SIMPLE.key]
        out.append(
            f"| herder throughput at least 3x rq worker-pool (default class) "
            f"| {fmt_ratio(r1)} | {yn(r1, r1 >= 3)} |"
        )
        out.append(
            f"| herder throughput within 5% of rq worker-pool SimpleWorker (ratio at least 0.95) "
            f"| {fmt_ratio(r2)} | {yn(r2, r2 >= 0.95)} |"
        )
    out.append("")

    stops = [
        f"{c.label}: {median([r['stop'].seconds for r in thr.get(c.key, [])]):.1f} s"
        for c in THROUGHPUT_CONTENDERS
        if thr.get(c.key)
    ]
    if stops:
        out += [
            f"Graceful stop (SIGTERM to exit, median, not part of any number above): {'; '.join(stops)}.",
            "",
        ]
    out += ["## Problems seen", ""]
    out += [f"- {p}" for p in problems] or ["None."]
    out += ["", "## Noise warnings", ""]
    out += [f"- {w}" for w in warnings] or [
        "None: other processes stayed under --max-other-load in every run."
    ]
    out.append("")
    return "\n".join(out)


def yn(value: float, ok: bool) -> str:
    return "n/a" if math.isnan(value) else ("yes" if ok else "**no**")


# ---- main ----------------------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/bench",
        description="Benchmark herder against `rq worker-pool` (throughput, crash-to-replacement latency).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--workers", type=int, default=4, help="workers per pool, the same for every contender")
    p.add_argument("--jobs", type=int, default=2000, help="no-op jobs per throughput round")
    p.add_argument(
        "--rounds", type=int, default=3, help="throughput rounds per contender (the median is reported)"
    )
    p.add_argument("--kills", type=int, default=10, help="workers killed per contender in the crash test")
    p.add_argument("--markdown", metavar="PATH", help="also write the report to this file")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-crash", action="store_true")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    p.add_argument(
        "--bin-dir",
        default=os.path.dirname(sys.executable),
        help="where the `herder` and `rq` commands are (by default next to this Python)",
    )
    p.add_argument(
        "--poll-interval", type=float, default=0.002, help="seconds between polls in the crash test"
    )
    p.add_argument("--settle", type=float, default=0.5, help="seconds of idle pool before each kill")
    p.add_argument(
        "--min-age",
        type=float,
        default=HERDER_MIN_UPTIME + 0.5,
        help="only kill workers at least this old (herder backs off on workers dying within --min-uptime)",
    )
    p.add_argument(
        "--round-timeout", type=float, default=300.0, help="give up on a throughput round after this"
    )
    p.add_argument(
        "--stop-timeout", type=float, default=30.0, help="seconds a pool may take to stop on SIGTERM"
    )
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.25,
        help="flag a run as noisy when other processes used more CPU than this (cores, on average)",
    )
    p.add_argument(
        "--snapshot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run herder from a copy of its source taken at the start (immune to edits during the run)",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="before each run, wait up to this long for other processes to use less than --max-other-load",
    )
    p.add_argument(
        "--keep-tmp", action="store_true", help="keep the temp dir (logs); it is kept anyway on problems"
    )
    args = p.parse_args(argv)
    if args.workers < 1 or args.jobs < 1 or args.rounds < 1 or args.kills < 1:
        p.error("--workers, --jobs, --rounds and --kills must be at least 1")
    for tool in ("herder", "rq"):
        if not os.access(Path(args.bin_dir) / tool, os.X_OK):
            p.error(f"no `{tool}` in {args.bin_dir}; pass --bin-dir")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join([os.environ.get("HERDER_BENCH_ARGV0", sys.argv[0]), *argv])
    if not sys.platform.startswith("linux"):
        say("Linux only (psutil children, prctl subreaper, process groups)")
        return 2

    def on_signal(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    if not become_subreaper():
        say("warning: could not become a child subreaper; orphaned workers may escape the cleanup")

    tmp = Path(tempfile.mkdtemp(prefix="herder-bench-"))
    procs = Processes()
    server = RedisServer(args.redis_server, tmp, procs)
    bench: Bench | None = None
    code = 0
    try:
        bench = Bench(args, tmp, procs, server)
        say(f"redis-server pid {server.pid} on {server.url}; logs in {tmp}")
        digest = herder_digest(bench.herder_src or REPO)
        if bench.herder_src:
            say(f"herder runs from a snapshot of its source (digest {digest}) in {bench.herder_src}")
        facts = machine_facts(bench.redis, bench.bindir, digest)
        thr = {} if args.skip_throughput else bench.throughput()
        crash = {} if args.skip_crash else bench.crash()
        if herder_digest(REPO) != digest:
            note = (
                f"herder's source in the working tree changed during the run (digest {digest} -> "
                f"{herder_digest()})"
            )
            if bench.herder_src:
                bench.warnings.append(f"{note}; every run used the snapshot taken at the start")
            else:
                bench.problems.append(f"{note}: some runs measured different code")
        report = render(args, command, facts, thr, crash, bench.problems, bench.warnings)
        print(report)
        if args.markdown:
            Path(args.markdown).write_text(report)
            say(f"report written to {args.markdown}")
        code = 1 if bench.problems else 0
    except (KeyboardInterrupt, Interrupted) as exc:
        say(f"interrupted ({exc.__class__.__name__} {exc}): cleaning up")
        code = 130
    except BenchError as exc:
        say(f"error: {exc}")
        code = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # the cleanup must not be cut short
        hit = procs.kill_all(spare={server.pid})
        if hit:
            say(f"cleanup: killed {hit} leftover process(es)")
        server.stop()
        procs.kill_all(spare=set())
        if code == 0 and not args.keep_tmp:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            say(f"logs kept in {tmp}")
    return code
