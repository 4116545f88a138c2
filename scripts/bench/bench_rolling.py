"""A rolling restart of a big fleet: how many workers keep taking jobs while `herder restart`
replaces every one of them.

    scripts/bench/run rolling                          # 256 workers, 1 s jobs, one run
    scripts/bench/run rolling --workers 16,64 --runs 3 --markdown /tmp/rolling.md

One run: a private redis-server; `herder run --workers N --workers-limit N + N//4` (room for the
master's whole surge: replacements start first, up to a batch of N//4 beyond the target); a
feeder that tops the queue up in batches, so it never runs dry nor grows without bound; each
job sleeps `--job-s` and then counts itself in Redis (a set of job ids, and a count of runs).
Once all N workers are taking jobs, a steady window of `--steady-s` gives the jobs/s before;
then `herder restart` (its command line), and a look every `--interval` (0.1 s) until every
worker pid of before is gone (from herder's log, from RQ and from the machine) and N new
ones are taking jobs. At the end the feeder stops, the queue drains, herder gets SIGTERM.

A worker is *taking jobs* at a look when both hold:
- herder's log says its last move was to `idle` or `busy`: it said ready, and the master has
  not told it to stop (`stopping`) nor killed it (`killing`). The master logs every move of a
  worker but the idle <-> busy flips of its jobs, with 1 ms timestamps; the bench reads the log
  as it grows, so looking costs the master nothing (`herder status` would build it a snapshot
  of every worker each time);
- RQ lists it on the queue (a key in rq:workers:<queue> whose hash names that pid) and its RQ
  state is not `suspended`.
The fraction taking jobs is that count over N. It may pass 1 while replacements and the old
workers they will replace are both ready.

Reported per run: the restart's duration (from `herder restart`'s reply to the last look
above), the lowest and the 5th-percentile fraction taking jobs among the looks from the moment
`herder restart` was run to that end, whether it stayed at or above 90% throughout, the
jobs/s before and during (and the worst whole second), and whether every enqueued job ran
exactly once, none failed and nothing was left running after herder's stop. The fewest ready
workers in herder's log at any moment (not only at a look) is a cross-check.
herder is the only contender: rq worker-pool has no rolling restart.

Exit 0 when every run held 90% throughout with no job lost and nothing left behind, 1 when one
did not, 2 on a set-up error (the logs are kept then).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from redis import Redis
from rq import Queue

from bench_base import BenchError, Interrupted, UsageError, say, wait_for
from bench_commands import herder_argv, herder_ctl_argv
from bench_procs import Processes, child_env, end_all, raise_open_files, start_redis, take_charge
from bench_report import publish
from bench_source import git_state, herder_digest, snapshot_herder

SUMMARY = "a rolling restart of a big fleet: the share of workers taking jobs throughout"
QUEUE = "rolling"
JOB_MODULE = "rolling_jobs"
DONE = "bench:rolling:done"  # the id of every job that ran: each enqueued job must be here once
RUNS = "bench:rolling:runs"  # how many times a job ran: more than the ids is a job run twice
JOB_SOURCE = f'''"""Written by scripts/bench rolling: a busy worker's job, which counts itself."""
import time

from rq import get_current_job


def work(seconds):
    time.sleep(seconds)
    job = get_current_job()
    pipe = job.connection.pipeline(transaction=False)
    pipe.sadd("{DONE}", job.id)
    pipe.incr("{RUNS}")
    pipe.execute()
'''
READY = ("idle", "busy")  # herder's states of a worker that took its place and was not told to go
# A move in herder's log, e.g. "2026-11-22 02:27:08,264 herder[3798] INFO slot 0 pid 3814: busy -> stopping
# (...)": the pid and its new state (the scheduler's lines name no slot); or a master's start,
# e.g. "... herder[4356] INFO master 4356 starting: 256 workers on ...".
LINE_RE = re.compile(
    rb"^\S+ \S+ herder\[\d+\] \w+ (?:slot \d+ pid (\d+): \w+ -> (\w+)|master \d+ starting:)", re.M
)
ORPHANED = "orphaned"  # a worker of a master that is gone: it finishes its job and exits by itself
THRESHOLD = 0.9  # the share of the fleet that must be taking jobs throughout
BATCH = 1000  # jobs enqueued at once, in one pipeline
WARM_UP = 2.0  # seconds of feeding before the steady window


@dataclass(frozen=True)
class Look:
    """What one look saw: pids by where they are listed, and the jobs done so far."""

    at: float  # time.monotonic()
    ready: frozenset[int]  # herder's log: idle or busy
    listed: frozenset[int]  # herder's log: in any state but exited (starting and stopping ones too)
    registered: frozenset[int]  # RQ: on the queue, not suspended
    done: int  # distinct jobs finished
    backlog: int  # jobs waiting in the queue
    took: float  # seconds the look itself took (herder's log, then RQ)

    @property
    def taking(self) -> frozenset[int]:
        return self.ready & self.registered


@dataclass
class Result:
    """One run, as reported (and written by --json)."""

    workers: int
    run: int
    load_before: float  # 1-minute load average when herder was started, and after its stop
    load_after: float = math.nan
    ready_s: float = math.nan  # herder run -> all N taking jobs
    steady_rate: float = math.nan  # jobs/s in the steady window
    cli_s: float = math.nan  # `herder restart` itself: the command's run
    duration: float = math.nan  # its reply -> every old pid gone and N new ones taking jobs
    looks: int = 0  # looks from `herder restart` to the end
    max_gap_ms: float = math.nan  # the longest time between two of those looks
    look_ms: float = math.nan  # the median time a look took
    min_fraction: float = math.nan
    p5_fraction: float = math.nan
    held: bool = False  # at or above THRESHOLD at every look
    during_rate: float = math.nan  # jobs/s from `herder restart` to the end
    worst_second: float = math.nan  # the fewest jobs done in a whole second of it
    per_second: list[float] = field(default_factory=list)
    min_backlog: int = 0  # the fewest jobs waiting at a look, from ready to the end: > 0, never dry
    log_min_ready: int | None = None  # the fewest idle or busy workers in herder's log, during it
    masters: int = 0  # masters started during the run: 1, unless the watchdog replaced one
    lowest: dict = field(default_factory=dict)  # the look with the fewest taking jobs, by its counts
    series: list[dict] = field(default_factory=list)  # every look from `herder restart` to the end
    enqueued: int = 0
    done: int = 0
    runs: int = 0
    failed: int = 0
    left_running: list[str] = field(default_factory=list)  # processes left after herder's exit
    rq_left: int = 0  # RQ workers still registered on the queue after herder's exit
    exit_code: int | None = None
    finished: bool = False  # the restart ended within --restart-timeout
    replaced: int = 0  # old workers gone at the end (all N when it finished)

    @property
    def clean(self) -> bool:
        """No job lost, failed or run twice, and nothing left behind."""
        return (
            self.done == self.enqueued == self.runs
            and not self.failed
            and not self.left_running
            and not self.rq_left
            and self.exit_code == 0
        )


class HerderLog:
    """Each worker's state as herder's log says, read as the log grows: the master logs every
    move of a worker (`slot 3 pid 812: starting -> idle (...)`, 1 ms timestamps) but the
    idle <-> busy flips of its jobs. Asking the master instead (`herder status`) has it build
    a snapshot of every worker (their RSS and CPU read from /proc) ten times a second: with
    that, at 256 busy workers on 2 cores, `herder restart` went unanswered once (the master's
    loop has 5 s to answer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""
        self.states: dict[int, str] = {}  # pid: its last state
        self.ready = 0  # how many are idle or busy
        self.fewest: int | None = None  # the fewest ready at any moment while `watching`
        self.watching = False
        self.masters = 0  # masters started (the watchdog starts another if one hangs or dies)

    def update(self) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data = self.rest + data
        cut = data.rfind(b"\n") + 1  # a line half written waits for the next look
        self.rest = data[cut:]
        for m in LINE_RE.finditer(data[:cut]):
            if m[1] is None:  # a new master: the workers of the one before are on their way out
                self.masters += 1
                moved = {pid: ORPHANED for pid, state in self.states.items() if state != "exited"}
            else:
                moved = {int(m[1]): m[2].decode()}
            for pid, state in moved.items():
                self.ready += (state in READY) - (self.states.get(pid) in READY)
                self.states[pid] = state
            if self.watching:
                self.fewest = self.ready if self.fewest is None else min(self.fewest, self.ready)


class Sampler(threading.Thread):
    """Looks every `interval` seconds (back to back when one takes longer), from start to stop."""

    def __init__(self, conn: Redis, log: Path, interval: float) -> None:
        super().__init__(name="rolling-sampler", daemon=True)
        self.conn, self.log, self.interval = conn, HerderLog(log), interval
        self.looks: list[Look] = []
        self.halt = threading.Event()
        self.lock = threading.Lock()

    def look(self) -> Look:
        began = time.monotonic()
        self.log.update()
        keys = self.conn.smembers(f"rq:workers:{QUEUE}")
        pipe = self.conn.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "pid", "state")
        pipe.scard(DONE)
        pipe.llen(f"rq:queue:{QUEUE}")
        *rows, done, backlog = pipe.execute()
        states = self.log.states
        return Look(
            at=time.monotonic(),
            ready=frozenset(pid for pid, state in states.items() if state in READY),
            listed=frozenset(pid for pid, state in states.items() if state not in ("exited", ORPHANED)),
            registered=frozenset(int(pid) for pid, state in rows if pid and state != b"suspended"),
            done=int(done),
            backlog=int(backlog),
            took=time.monotonic() - began,
        )

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.halt.is_set():
            with contextlib.suppress(OSError):  # herder's log not there yet
                seen = self.look()
                with self.lock:
                    self.looks.append(seen)
            next_at += self.interval
            self.halt.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic())

    def last(self) -> Look | None:
        with self.lock:
            return self.looks[-1] if self.looks else None

    def since(self, t: float) -> list[Look]:
        with self.lock:
            return [x for x in self.looks if x.at >= t]

    def stop(self) -> None:
        self.halt.set()
        self.join(10)


class Feeder(threading.Thread):
    """Keeps between `low` and 2 x `low` jobs waiting, topping up in batches of BATCH."""

    def __init__(self, conn: Redis, job_s: float, low: int) -> None:
        super().__init__(name="rolling-feeder", daemon=True)
        self.queue = Queue(QUEUE, connection=conn)
        self.job_s, self.low = job_s, low
        self.enqueued = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set():
                waiting = self.queue.count
                if waiting < self.low:
                    n = min(BATCH, 2 * self.low - waiting)
                    data = Queue.prepare_data(f"{JOB_MODULE}.work", (self.job_s,), result_ttl=0)
                    self.queue.enqueue_many([data] * n)
                    self.enqueued += n
                    continue
                self.halt.wait(0.02)
        except BaseException as exc:  # noqa: BLE001  (said by the run, which then fails)
            self.error = exc

    def stop(self) -> None:
        self.halt.set()
        self.join(30)


def percentile(xs: list[float], q: float) -> float:
    """Nearest rank: the 5th percentile of 100 sorted values is the 5th."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def done_at(looks: list[Look], t: float) -> float:
    """Jobs done at time t, linear between the two looks around it."""
    for a, b in zip(looks, looks[1:], strict=False):
        if a.at <= t <= b.at:
            return a.done + (b.done - a.done) * ((t - a.at) / (b.at - a.at) if b.at > a.at else 0.0)
    return float(looks[-1].done if t > looks[-1].at else looks[0].done)


def one_run(args: argparse.Namespace, n: int, k: int, tmp: Path, env: dict[str, str]) -> Result:
    """Start herder on a fresh Redis, feed it, restart it, look until the restart is over."""
    (tmp / "jobs").mkdir(parents=True)
    (tmp / "jobs" / f"{JOB_MODULE}.py").write_text(JOB_SOURCE)
    state = tmp / "state"
    procs = Processes()
    res = Result(workers=n, run=k, load_before=os.getloadavg()[0])
    herder = feeder = sampler = None
    server, conn = start_redis(tmp, procs)
    try:
        argv = herder_argv(server.url, workers=n, workers_limit=n + max(1, n // 4), queue=QUEUE,
                           path=tmp / "jobs", state_dir=state)  # fmt: skip
        started = time.monotonic()
        herder = procs.start(argv, tmp / "herder.log", env)
        sampler = Sampler(conn, tmp / "herder.log", args.interval)
        sampler.start()

        def all_taking() -> Look | None:
            seen = sampler.last()
            return seen if seen and len(seen.taking) >= n and len(seen.listed) == n else None

        # The fleet starts on an empty queue: fed, a big one takes minutes longer on 2 cores.
        ready = wait_for(f"all {n} workers taking jobs", all_taking, 60 + 2 * n, interval=0.05)
        res.ready_s = ready.at - started
        # Enough waiting that the queue outlasts a top-up (at most N jobs go every job's length)
        # and a stall of this process of a few seconds on a loaded machine (one of 2 s emptied
        # 2N + 100 at 256 workers); bounded: the feeder stops at twice that.
        feeder = Feeder(conn, args.job_s, low=4 * n + 500)
        feeder.start()
        time.sleep(WARM_UP)  # every worker's first job, the queue's first top-ups
        before = wait_for(f"all {n} workers taking jobs", all_taking, 60 + n, interval=0.05)
        time.sleep(args.steady_s)
        steady = sampler.since(before.at)
        res.steady_rate = (steady[-1].done - steady[0].done) / (steady[-1].at - steady[0].at)
        old = sampler.last().listed  # type: ignore[union-attr]  (looks were taken above)

        sampler.log.watching = True
        asked = time.monotonic()
        reply = subprocess.run(herder_ctl_argv(state, "restart"), env=env, capture_output=True, text=True,
                               timeout=60, check=False)  # fmt: skip
        answered = time.monotonic()
        res.cli_s = answered - asked
        if reply.returncode != 0:
            raise BenchError(f"herder restart failed ({reply.returncode}): {reply.stderr.strip()[-300:]}")
        say(f"{n} workers: {reply.stdout.strip()} ({res.cli_s:.2f} s)")

        def over() -> Look | None:
            seen = sampler.last()
            if seen is None or seen.at <= answered or old & (seen.listed | seen.registered):
                return None
            return seen if len(seen.taking - old) >= n else None

        try:
            end = wait_for("the restart to end", over, args.restart_timeout, interval=0.05)
            # The old pids are gone from herder and RQ; their processes may still be exiting.
            wait_for("the old workers' processes to exit", lambda: not any(alive(p) for p in old), 30)
            res.finished = True
        except BenchError:  # reported as far as it went
            end = sampler.last()  # type: ignore[assignment]  (looks were taken above)
            say(f"{n} workers: the restart did not end within {args.restart_timeout:g} s")
        res.duration = end.at - answered
        res.replaced = len(old - end.listed - end.registered)
        judge(res, sampler.since(asked), asked, end.at)
        sampler.log.watching = False
        res.log_min_ready = sampler.log.fewest
        res.min_backlog = min(x.backlog for x in sampler.since(before.at))

        feeder.stop()
        if feeder.error:
            raise BenchError(f"the feeder failed: {feeder.error!r}")
        res.enqueued = feeder.enqueued
        failed = Queue(QUEUE, connection=conn).failed_job_registry

        def drained() -> bool:  # every job ran or failed (a lost one: this times out)
            return int(conn.scard(DONE)) + failed.count >= res.enqueued

        try:
            wait_for("the queue to drain", drained, 60 + 2 * res.enqueued * args.job_s / n, interval=0.1)
        except BenchError as exc:  # a job lost: the report says how many
            say(f"{n} workers: {exc}")
        sampler.stop()
        res.done, res.runs, res.failed = int(conn.scard(DONE)), int(conn.get(RUNS) or 0), failed.count
        res.masters = sampler.log.masters
        res.exit_code = stop_herder(herder)
        res.left_running = leftovers(server.pid)
        res.rq_left = int(conn.scard(f"rq:workers:{QUEUE}"))
        res.load_after = os.getloadavg()[0]
        return res
    finally:
        for thread in (feeder, sampler):
            if thread is not None:
                thread.stop()
        if herder is not None:
            procs.stop(herder, 60, spare={server.pid})
        end_all(procs, server)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_herder(herder: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, as a service manager stops it; its exit code, None if it did not exit in 120 s."""
    herder.terminate()
    try:
        return herder.wait(120)
    except subprocess.TimeoutExpired:
        return None


def leftovers(spare: int) -> list[str]:
    """Our descendants still running once herder exited (Redis aside): as the subreaper, the
    bench inherits whatever herder's processes left behind."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid != spare and p.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid} {' '.join(p.cmdline())[:80]}")
        except psutil.NoSuchProcess:
            pass
    return found


def judge(res: Result, looks: list[Look], asked: float, end: float) -> None:
    """The fraction taking jobs at each look from `herder restart` to the end, and the jobs/s."""
    looks = [x for x in looks if x.at <= end]
    fractions = [len(x.taking) / res.workers for x in looks]
    res.looks = len(looks)
    res.max_gap_ms = max(
        (1000 * (b.at - a.at) for a, b in zip(looks, looks[1:], strict=False)), default=math.nan
    )
    res.look_ms = 1000 * statistics.median(x.took for x in looks) if looks else math.nan
    res.min_fraction = min(fractions, default=math.nan)
    res.series = [
        {"t": round(x.at - asked, 3), "taking": len(x.taking), "ready": len(x.ready),
         "registered": len(x.registered), "listed": len(x.listed), "done": x.done, "backlog": x.backlog}
        for x in looks
    ]  # fmt: skip
    if looks:
        res.lowest = min(res.series, key=lambda x: x["taking"])
    res.p5_fraction = percentile(fractions, 0.05)
    res.held = bool(fractions) and res.min_fraction >= THRESHOLD
    if len(looks) < 2:
        return
    res.during_rate = (looks[-1].done - looks[0].done) / (looks[-1].at - looks[0].at)
    seconds = int(looks[-1].at - asked)
    res.per_second = [
        round(done_at(looks, asked + s + 1) - done_at(looks, asked + s), 1) for s in range(seconds)
    ] or [round(res.during_rate, 1)]  # a restart of less than a second: its jobs/s throughout
    res.worst_second = min(res.per_second, default=math.nan)


def sizes(text: str) -> list[int]:
    try:
        found = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        found = []
    if not found or min(found) < 1:
        raise UsageError(f"--workers: a positive number or a comma list of them, not {text!r}")
    return found


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", default="256", help="herder's --workers; a comma list runs each size")
    p.add_argument("--job-s", type=float, default=1.0, help="each job's sleep, seconds (I/O-bound jobs)")
    p.add_argument("--runs", type=int, default=1, help="runs of each size")
    p.add_argument("--steady-s", type=float, default=5.0, help="the steady window before the restart")
    p.add_argument("--interval", type=float, default=0.1, help="seconds between two looks")
    p.add_argument(
        "--restart-timeout",
        type=float,
        default=600.0,
        help="seconds the restart may take (then: how far it got)",
    )
    p.add_argument("--markdown", help="also write the report here")
    p.add_argument("--json", help="write every run's figures here")


def run(args: argparse.Namespace) -> int:
    fleet = sizes(args.workers)
    if args.runs < 1 or args.job_s < 0 or args.interval <= 0 or args.steady_s <= 0:
        raise UsageError("--runs, --steady-s and --interval must be positive, --job-s not negative")
    take_charge()
    if note := raise_open_files(max(fleet) + max(fleet) // 4):
        say(f"open files: {note}")
    tmp = Path(tempfile.mkdtemp(prefix="herder-rolling-"))
    results: list[Result] = []
    try:
        src = snapshot_herder(tmp / "herder-src")
        args.herder = f"{git_state()}, snapshot digest {herder_digest(src)}"
        say(f"herder from a snapshot of its source: {args.herder}")
        env = child_env()
        env["PYTHONPATH"] = str(src)
        for n in fleet:
            for k in range(1, args.runs + 1):
                say(f"{n} workers, run {k}/{args.runs}: load average {os.getloadavg()[0]:.2f}")
                res = one_run(args, n, k, tmp / f"run-{n}-{k}", env)
                say(f"{n} workers, run {k}: {row(res)}")
                results.append(res)
    except (BenchError, KeyboardInterrupt, Interrupted) as exc:
        say(f"rolling: {exc!r}; logs kept in {tmp}")
        return 2
    report = render(args, results)
    publish(report, args.markdown)
    if args.json:
        Path(args.json).write_text(json.dumps([{**asdict(r), "clean": r.clean} for r in results], indent=1))
    ok = all(r.finished and r.held and r.clean for r in results)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        say(f"logs kept in {tmp}")
    return 0 if ok else 1


def pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def took(r: Result) -> str:
    """The restart's duration, or how far it got."""
    if r.finished:
        return f"{r.duration:.1f} s"
    return f"not over after {r.duration:.0f} s: {r.replaced} of {r.workers} replaced"


def row(r: Result) -> str:
    jobs = f"{r.done}/{r.enqueued} done, {r.failed} failed, {r.runs - r.done} ran twice"
    left = f"{len(r.left_running)} processes and {r.rq_left} RQ workers left"
    return (
        f"{took(r)}; taking jobs min {pct(r.min_fraction)}, p5 {pct(r.p5_fraction)} "
        f"({'held' if r.held else 'NOT held'}); {r.steady_rate:.0f} -> {r.during_rate:.0f} jobs/s "
        f"(worst second {r.worst_second:.0f}); {jobs}; {left}; exit {r.exit_code}"
    )


def render(args: argparse.Namespace, results: list[Result]) -> str:
    held = all(r.held for r in results)
    clean = all(r.clean for r in results)
    lines = [
        "## Rolling restart of a big fleet",
        "",
        f"Command: `scripts/bench/run rolling --workers {args.workers} --job-s {args.job_s:g} "
        f"--runs {args.runs}`. `herder run --workers N --workers-limit N+N/4`, the queue kept fed "
        f"with jobs that sleep {args.job_s * 1000:.0f} ms; after a {args.steady_s:g} s steady window, "
        f"`herder restart`, and a look every {args.interval * 1000:.0f} ms until every old worker is gone "
        "and N new ones take jobs. Taking jobs: `idle` or `busy` by its last move in herder's log "
        "(said ready, not told to stop) and registered on the queue in RQ. herder only: rq worker-pool "
        "has no rolling restart.",
        "",
        f"herder at {args.herder}; {os.cpu_count()} CPUs.",
        "",
        "| workers | run | `herder restart` answered | restart | taking jobs: min | (ready, in RQ) | p5 "
        "| >= 90% throughout | masters | fewest waiting "
        "| jobs/s before | during | worst second | fewest ready (log) | looks (max gap, median look) "
        "| jobs done / enqueued, failed, ran twice | left after the stop | load before -> after |",
        "|---:|---:|---:|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for r in results:
        left = (
            "nothing"
            if not r.left_running and not r.rq_left
            else f"{len(r.left_running)} procs, {r.rq_left} RQ"
        )
        lines.append(
            f"| {r.workers} | {r.run} | {r.cli_s:.1f} s | {took(r)} | {pct(r.min_fraction)} "
            f"| {r.lowest.get('ready')}, {r.lowest.get('registered')} | {pct(r.p5_fraction)} "
            f"| {'yes' if r.held else 'NO'}{'' if r.finished else ' (so far)'} "
            f"| {r.masters} | {r.min_backlog} "
            f"| {r.steady_rate:.0f} | {r.during_rate:.0f} ({r.during_rate / r.steady_rate:.2f}x) "
            f"| {r.worst_second:.0f} | {r.log_min_ready} "
            f"| {r.looks} ({r.max_gap_ms:.0f} ms, {r.look_ms:.0f} ms) "
            f"| {r.done} / {r.enqueued}, {r.failed}, {r.runs - r.done} | {left} "
            f"| {r.load_before:.2f} -> {r.load_after:.2f} |"
        )
    over = all(r.finished for r in results)
    lines += [
        "",
        "(ready, in RQ): at the look with the fewest taking jobs, the workers idle or busy in herder's "
        "log and those registered in RQ. masters: masters started in the run (more than 1: the "
        "watchdog replaced one). fewest waiting: jobs in the queue at a look, from the steady window "
        "on (0: it ran dry). fewest ready (log): at any moment of the restart, not only at a look.",
        "",
        f"Every restart ended within {args.restart_timeout:g} s: {'yes' if over else 'NO'}. Every run "
        f"held {THRESHOLD:.0%} throughout: {'yes' if held else 'NO'}. Every job ran once, none failed, "
        f"nothing left running after herder's stop: {'yes' if clean else 'NO'}.",
    ]
    return "\n".join(lines) + "\n"
