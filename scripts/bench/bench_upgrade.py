"""An upgrade of herder under steady load: what `herder upgrade` costs, beside a stop and start of
herder (what `systemctl restart herder` does) and rq's worker-pool stopped and started.

    scripts/bench/run upgrade                          # 4 workers, 20 upgrades, 3 restarts each
    scripts/bench/run upgrade --markdown /tmp/upgrade.md

One run, on a private redis-server: a feeder enqueues jobs at a steady rate (each sleeps a
random 50-500 ms, then records when it started and counts itself), enough to keep a pool of
`--workers` about `--busy` busy. A sampler looks every 10 ms at RQ's workers on the queue that
are idle or busy (registered, not gone). Then, in turn:

- herder (`herder run --workers N`): `--upgrades` times `herder upgrade` in a row, alternating
  between two builds of this checkout, its own version and one bumped (two snapshots of its
  packages, bench_source.snapshot_herder; the one herder imports is switched before each
  upgrade, as `pip install --upgrade` replaces an installed one), each upgrade checked to run
  the other version (`herder status`); then `--restarts` times `herder stop` followed by the
  same `herder run`;
- rq worker-pool (`rq worker-pool -n N`): `--restarts` times SIGTERM (its warm shutdown: every
  job finishes), then the same command again.

For each event, from its start until N workers take jobs again and one more second has passed:
the capacity lost, in worker-seconds (the integral of N less the workers idle or busy, when
fewer), and the longest wait of a job that started in that window (from its enqueue to its
start). At the end: every job ran exactly once. Exit 0 when so, 1 when not, 2 on a set-up error.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.registry import FailedJobRegistry

from bench_base import BenchError, Interrupted, say, wait_for
from bench_commands import herder_argv, herder_ctl_argv, rq_pool_argv
from bench_procs import Processes, child_env, end_all, start_redis, take_charge
from bench_report import publish
from bench_source import git_state, scratch, snapshot_herder

SUMMARY = "herder upgrade under load, beside a stop and start of herder and of rq worker-pool"
QUEUE = "upgrade"
JOB_MODULE = "upgrade_jobs.py"
STARTS = "bench:upgrade:starts"  # job id -> when it started (time.time())
RUNS = "bench:upgrade:runs"  # how many times a job ran: more than the ids is a job run twice
JOB_SOURCE = f'''"""Written by scripts/bench upgrade: a job that records its start and counts itself."""
import time

from rq import get_current_job


def work(seconds):
    job = get_current_job()
    job.connection.hset("{STARTS}", job.id, repr(time.time()))
    time.sleep(seconds)
    job.connection.incr("{RUNS}")
'''
SETTLE = 1.0  # seconds an event's window runs on once N workers take jobs again


@dataclass
class Event:
    kind: str  # "herder upgrade", "herder stop + run", "rq worker-pool stop + start"
    began: float  # time.time()
    ended: float = math.nan  # N take jobs again, plus SETTLE
    took: float = math.nan  # the command (upgrade) or the stop and start, seconds
    lost: float = math.nan  # worker-seconds
    longest_wait: float = math.nan  # seconds
    fewest: int = 0  # the fewest workers taking jobs at a look
    ok: bool = True  # `herder upgrade` exited 0 and the other build runs


@dataclass
class Sampler:
    conn: Redis
    looks: list[tuple[float, int]] = field(default_factory=list)  # (time.time(), idle or busy)
    done: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.done.wait(0.01):
            keys = self.conn.smembers(f"rq:workers:{QUEUE}")
            pipe = self.conn.pipeline(transaction=False)
            for key in keys:
                pipe.hget(key, "state")
            states = pipe.execute()
            self.looks.append((time.time(), sum(s in (b"idle", b"busy") for s in states)))

    def taking(self) -> int:
        return self.looks[-1][1] if self.looks else 0


class Feeder:
    """Jobs of 50-500 ms at a steady rate; the enqueue time of each, by id."""

    def __init__(self, conn: Redis, rate: float) -> None:
        self.queue = Queue(QUEUE, connection=conn)
        self.every, self.rng = 1.0 / rate, random.Random(53)
        self.enqueued: dict[str, float] = {}
        self.done = threading.Event()

    def run(self) -> None:
        nxt = time.monotonic()
        while not self.done.is_set():
            at = time.time()
            job = self.queue.enqueue(f"{JOB_MODULE[:-3]}.work", self.rng.uniform(0.05, 0.5))
            self.enqueued[job.id] = at
            nxt += self.every
            self.done.wait(max(0.0, nxt - time.monotonic()))


def measure(ev: Event, n: int, looks: list[tuple[float, int]], starts: dict[str, float], enq: dict) -> None:
    window = [(t, k) for t, k in looks if ev.began <= t <= ev.ended]
    ev.fewest = min((k for _, k in window), default=0)
    ev.lost = sum(max(0, n - k) * (t2 - t1) for (t1, k), (t2, _) in zip(window, window[1:], strict=False))
    waits = [s - enq[j] for j, s in starts.items() if j in enq and ev.began <= s <= ev.ended]
    ev.longest_wait = max(waits, default=0.0)


def back_to(n: int, sampler: Sampler, what: str, timeout: float = 120.0) -> None:
    wait_for(f"{n} workers taking jobs ({what})", lambda: sampler.taking() >= n, timeout)


@dataclass
class Builds:
    """Two snapshots of herder's packages, its version and a bumped one; herder imports the one
    `current` (a symlink on its PYTHONPATH) points at."""

    current: Path
    snapshots: dict[str, Path]  # version -> its snapshot

    @classmethod
    def make(cls, tmp: Path) -> Builds:
        a = snapshot_herder(tmp / "herder-a")
        init = a.joinpath("herder", "supervisor", "__init__.py")
        version = init.read_text().split('__version__ = "', 1)[1].split('"', 1)[0]
        bumped = version.replace(".dev", ".post1.dev") if ".dev" in version else version + ".post1"
        b = snapshot_herder(tmp / "herder-b")
        init_b = b.joinpath("herder", "supervisor", "__init__.py")
        init_b.write_text(init_b.read_text().replace(f'"{version}"', f'"{bumped}"'))
        compileall.compile_file(str(init_b), quiet=1, force=True)
        builds = cls(tmp / "current-herder", {version: a, bumped: b})
        builds.use(version)
        return builds

    def use(self, version: str) -> None:
        """Switch the build herder imports (atomically: a new symlink renamed over the old)."""
        link = self.current.with_name("next-herder")
        link.unlink(missing_ok=True)
        link.symlink_to(self.snapshots[version])
        os.replace(link, self.current)

    def env(self) -> dict[str, str]:
        return child_env() | {"PYTHONPATH": str(self.current)}


def herder_events(
    args: argparse.Namespace, procs: Processes, url: str, tmp: Path, sampler: Sampler
) -> list[Event]:
    n, state = args.workers, tmp / "state"
    builds = Builds.make(tmp)
    versions, env = list(builds.snapshots), builds.env()
    run = herder_argv(url, workers=n, queue=QUEUE, path=tmp / "jobs", state_dir=state, scheduler=False)
    herder = procs.start(run, tmp / "herder.log", env)
    back_to(n, sampler, "herder started")
    time.sleep(2.0)
    events = []
    for i in range(args.upgrades):
        to = versions[(i + 1) % 2]
        builds.use(to)
        ev = Event("herder upgrade", time.time())
        argv = herder_ctl_argv(state, "upgrade", "--timeout", "120")
        r = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        ev.took, ev.ok = time.time() - ev.began, r.returncode == 0
        if not ev.ok:
            say(f"herder upgrade {i + 1} exited {r.returncode}: {r.stderr.strip()}")
        st = subprocess.run(
            herder_ctl_argv(state, "status", "--json"), capture_output=True, env=env, check=False
        )
        running = json.loads(st.stdout or b"{}").get("version")
        if running != to:
            say(f"herder upgrade {i + 1}: herder {running} runs, not {to}")
            ev.ok = False
        back_to(n, sampler, "after herder upgrade")
        time.sleep(SETTLE)
        ev.ended = time.time()
        events.append(ev)
    for _ in range(args.restarts):
        ev = Event("herder stop + run", time.time())
        subprocess.run(herder_ctl_argv(state, "stop"), capture_output=True, env=env, check=False)
        herder.wait(120)
        herder = procs.start(run, tmp / "herder.log", env)
        back_to(n, sampler, "herder started again")
        ev.took = time.time() - ev.began
        time.sleep(SETTLE)
        ev.ended = time.time()
        events.append(ev)
    subprocess.run(herder_ctl_argv(state, "stop"), capture_output=True, env=env, check=False)
    herder.wait(120)
    return events


def pool_events(
    args: argparse.Namespace, procs: Processes, redis: tuple[str, int], tmp: Path, sampler: Sampler
) -> tuple[list[Event], subprocess.Popen[bytes]]:
    """`redis`: its URL and its pid, which a stop's cleanup spares."""
    n, (url, spare) = args.workers, redis
    argv = rq_pool_argv(url, workers=n, queue=QUEUE, path=tmp / "jobs")
    pool = procs.start(argv, tmp / "pool.log")
    back_to(n, sampler, "rq worker-pool started")
    time.sleep(2.0)
    events = []
    for _ in range(args.restarts):
        ev = Event("rq worker-pool stop + start", time.time())
        procs.stop(pool, timeout=120, spare={spare})
        pool = procs.start(argv, tmp / "pool.log")
        back_to(n, sampler, "rq worker-pool started again")
        ev.took = time.time() - ev.began
        time.sleep(SETTLE)
        ev.ended = time.time()
        events.append(ev)
    return events, pool  # the last pool drains the queue, then stops


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help="the pool's workers (herder's, rq's)")
    p.add_argument("--busy", type=float, default=0.7, help="the share of the pool the load keeps busy")
    p.add_argument("--upgrades", type=int, default=20, help="`herder upgrade`s in a row")
    p.add_argument("--restarts", type=int, default=3, help="stops and starts of each")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    take_charge()
    tmp = scratch("herder-upgrade-", JOB_MODULE, JOB_SOURCE)
    procs, server = Processes(), None
    rate = args.busy * args.workers / 0.275  # the jobs' mean: 275 ms
    try:
        server, conn = start_redis(tmp / "redis", procs)
        sampler, feeder = Sampler(Redis.from_url(server.url)), Feeder(Redis.from_url(server.url), rate)
        threads = [threading.Thread(target=x.run, daemon=True) for x in (sampler, feeder)]
        for t in threads:
            t.start()
        say(f"{rate:.1f} jobs/s of 50-500 ms on {args.workers} workers; herder first")
        events = herder_events(args, procs, server.url, tmp, sampler)
        say("rq worker-pool")
        more, pool = pool_events(args, procs, (server.url, server.pid), tmp, sampler)
        events += more
        feeder.done.set()
        wait_for("the queue to drain", lambda: not Queue(QUEUE, connection=conn).count, 60)
        with contextlib.suppress(BenchError):  # short of it: reported below
            wait_for("the last jobs", lambda: int(conn.get(RUNS) or 0) >= len(feeder.enqueued), 30)
        failed = FailedJobRegistry(QUEUE, connection=conn).get_job_ids()
        if failed:
            say(f"failed jobs: {len(failed)}, e.g. {conn.hget('rq:job:' + failed[0], 'exc_info')}")
        procs.stop(pool, timeout=120, spare={server.pid})
        sampler.done.set()
        for t in threads:
            t.join(10)
        starts = {k.decode(): float(v) for k, v in conn.hgetall(STARTS).items()}
        for ev in events:
            measure(ev, args.workers, sampler.looks, starts, feeder.enqueued)
        runs = int(conn.get(RUNS) or 0)
        once = len(starts) == runs == len(feeder.enqueued)
    except (BenchError, KeyboardInterrupt, Interrupted) as exc:
        say(f"upgrade: {exc!r}; logs kept in {tmp}")
        return 2
    finally:
        end_all(procs, server)
    publish(render(args, events, rate, once, len(feeder.enqueued), runs), args.markdown)
    if once and all(ev.ok for ev in events):
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    say(f"logs kept in {tmp}")
    return 1


def render(
    args: argparse.Namespace, events: list[Event], rate: float, once: bool, enq: int, runs: int
) -> str:
    lines = [
        "## An upgrade: `herder upgrade` against a restart",
        "",
        f"Command: `scripts/bench/run upgrade --workers {args.workers} --upgrades {args.upgrades} --restarts "
        f"{args.restarts}`. {rate:.1f} jobs/s, each sleeping 50-500 ms (a pool of {args.workers} about "
        f"{100 * args.busy:.0f}% busy). The upgrades alternate between two builds of herder (its version and "
        "a bumped one), each checked to run the other. RQ's workers on the queue, idle or busy, looked at "
        "every 10 ms. Each "
        f"event's window: from its start until {args.workers} take jobs again, plus {SETTLE:g} s. Capacity "
        "lost: worker-seconds below the pool's count. Longest wait: enqueue to start, of a job started in "
        f"the window. herder at {git_state()}.",
        "",
        "| what | events | capacity lost, worker-s: median (max) | longest wait of a job, s: median (max) "
        "| fewest taking jobs | took, s: median |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in dict.fromkeys(ev.kind for ev in events):
        evs = [ev for ev in events if ev.kind == kind]
        lost, waits = [ev.lost for ev in evs], [ev.longest_wait for ev in evs]
        failed = sum(not ev.ok for ev in evs)
        lines.append(
            f"| {kind}{f' ({failed} failed)' if failed else ''} | {len(evs)} "
            f"| {statistics.median(lost):.2f} ({max(lost):.2f}) "
            f"| {statistics.median(waits):.2f} ({max(waits):.2f}) "
            f"| {min(ev.fewest for ev in evs)} | {statistics.median([ev.took for ev in evs]):.1f} |"
        )
    lines += ["", f"Jobs: {enq} enqueued, {runs} runs: {'each exactly once' if once else 'NOT each once'}."]
    return "\n".join(lines) + "\n"
