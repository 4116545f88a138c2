"""The recycling scenario: workers retired after N jobs, and past a memory limit, replacement first.

    .venv/bin/pip install -e '.[bench]'
    scripts/bench/run recycle --png docs/recycling.png --markdown /tmp/recycle.md

Starts a private redis-server and `herder run --workers 4 --max-jobs 40 --max-jobs-jitter 30
--recycle-share 0.25 --max-memory 120`, feeds it a steady stream of short jobs (in its last
part some jobs leak memory), and samples herder's status (the reply `herder status --json`
prints, read from the control socket in process: on a busy 2-core machine the CLI took
about 0.5 s a call, most of it interpreter start-up) about every 0.2 s: workers by state, the desired
count, `totals.recycled`, the backlog. herder's log (1 ms timestamps) is replayed as well,
for the lowest count of ready workers between two samples. Draws the timeline
(matplotlib) and reports recycles, the lowest count of ready workers, jobs done and the
duration. Stops herder with SIGTERM. Not a test: run by hand.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from redis import Redis
from rq import Queue

from bench_base import BenchError, Interrupted, say, wait_for
from bench_commands import herder_argv
from bench_procs import Processes, end_all, start_redis, take_charge
from bench_report import publish
from herder.supervisor.ctl.client import call

SUMMARY = "workers recycled after N jobs and past a memory limit"
DONE = "bench:recycle:done"  # every finished job pushes its id here: each must appear once
LEAKED = "bench:recycle:leaked"  # and every leaking job the wall-clock time it ran
JOB_SOURCE = f'''import time

from rq import get_current_job

_leaked = []


def _done():
    job = get_current_job()
    job.connection.rpush("{DONE}", job.id)


def work(seconds):
    time.sleep(seconds)
    _done()


def leak(seconds, megabytes):
    """Like work, and keeps `megabytes` MB alive in this worker after it returns."""
    time.sleep(seconds)
    get_current_job().connection.rpush("{LEAKED}", time.time())
    block = bytearray(megabytes * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page: it counts in RSS
    _leaked.append(block)
    _done()
'''
READY = ("idle", "busy")
LEAVING = ("stopping", "killing")
MAX_JOBS = "recycled after max jobs"
MAX_MEMORY = "recycled after max memory"
# herder's log lines, e.g. "2026-11-22 02:27:08,264 herder[3798] INFO slot 0 pid 3814: busy -> stopping"
MOVE_RE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) herder\[\d+\] \w+ slot \d+ pid (\d+): (\w+) -> (\w+)"
)


@dataclass
class Run:
    """What one run saw; times in seconds since the first job was enqueued."""

    samples: list[dict] = field(default_factory=list)
    leak_from: float = 0.0  # when the first and the last leaking job ran
    leak_to: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average at the start and the end
    done_at: float | None = None  # every job done
    jobs: int = 0
    done: int = 0  # finished jobs, counted by their own marks
    unique: int = 0  # distinct job ids among them
    failed: int = 0
    baseline_rss_mb: float = 0.0  # a fresh worker's RSS
    log_min_ready: int | None = None  # from herder's log, between all ready and SIGTERM
    start_seconds: list[float] = field(default_factory=list)  # replacements: spawned -> ready, from the log
    exit_code: int | None = None
    final: dict = field(default_factory=dict)  # the last status


def status(state: Path) -> dict | None:
    """What `herder status --json --state-dir STATE` prints, or None if herder does not answer."""
    try:
        reply = call(str(state), {"cmd": "status"})
    except (OSError, ValueError):
        return None
    return reply if reply.get("ok") else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=4, help="herder's --workers")
    p.add_argument("--max-jobs", type=int, default=40, help="herder's --max-jobs")
    p.add_argument("--max-jobs-jitter", type=int, default=30, help="herder's --max-jobs-jitter")
    p.add_argument("--recycle-share", type=float, default=0.25, help="herder's --recycle-share")
    p.add_argument("--jobs", type=int, default=1000, help="short jobs in the steady stream")
    p.add_argument("--job-seconds", type=float, default=0.02, help="each job's sleep")
    p.add_argument("--rate", type=float, default=60.0, help="jobs enqueued per second")
    p.add_argument("--max-memory", type=int, default=120, help="MB; 0: no memory phase")
    p.add_argument("--max-memory-hard", type=int, default=600, help="MB; high, so nothing is killed")
    p.add_argument("--leak-jobs", type=int, default=40, help="jobs that leak, every 3rd job after the stream")
    p.add_argument("--leak-mb", type=int, default=25, help="MB each leaking job keeps alive")
    p.add_argument("--interval", type=float, default=0.2, help="seconds between status samples")
    p.add_argument("--png", help="draw the timeline into this PNG")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    if not args.max_memory:
        args.leak_jobs = 0
    take_charge()
    tmp = Path(tempfile.mkdtemp(prefix="herder-recycle-"))
    try:
        seen = measure(args, tmp)
    except (BenchError, KeyboardInterrupt, Interrupted) as exc:
        say(f"error: {exc!r}; logs kept in {tmp}")
        return 1

    report, ok = render(args, seen)
    publish(report, args.markdown)
    if args.png:
        draw(seen, args, Path(args.png))
        say(f"drew {args.png}")
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        say(f"logs kept in {tmp}")
    return 0 if ok else 1


def recycling_argv(args: argparse.Namespace, url: str, tmp: Path) -> list[str]:
    recycling = ["--max-jobs", str(args.max_jobs), "--max-jobs-jitter", str(args.max_jobs_jitter)]
    recycling += ["--recycle-share", str(args.recycle_share)]
    if args.max_memory:
        recycling += ["--max-memory", str(args.max_memory), "--max-memory-hard", str(args.max_memory_hard)]
    return herder_argv(url, workers=args.workers, path=tmp / "jobs", state_dir=tmp / "state", extra=recycling)


def measure(args: argparse.Namespace, tmp: Path) -> Run:
    """Run herder on a private Redis, stream the jobs in while sampling, then stop it with SIGTERM."""
    (tmp / "jobs").mkdir()
    (tmp / "jobs" / "recycle_jobs.py").write_text(JOB_SOURCE)
    state = tmp / "state"
    procs = Processes()
    herder = None
    run = Run(jobs=args.jobs + 3 * args.leak_jobs)
    stop_sampling = threading.Event()
    sampler = None
    server, r = start_redis(tmp, procs)
    try:
        herder = procs.start(recycling_argv(args, server.url, tmp), tmp / "herder.log")

        def running() -> dict | None:
            st = status(state)
            return st if st and st["running"] else None

        first = wait_for("herder to report running", running, timeout=60, interval=0.2)
        run.baseline_rss_mb = max(w["rss"] or 0 for w in first["workers"]) / 2**20
        t0, t0_wall = time.monotonic(), time.time()
        run.load = (os.getloadavg()[0], 0.0)
        sampler = threading.Thread(target=sample_loop, args=(state, t0, args.interval, run, stop_sampling))
        sampler.start()
        stream(r, args, t0)
        while run.done_at is None:  # until every job is done
            if (n := r.llen(DONE)) >= run.jobs:
                run.done_at = time.monotonic() - t0
            elif time.monotonic() - t0 > 120 + run.jobs / args.rate:
                raise BenchError(f"only {n} of {run.jobs} jobs done after 120 s; see {tmp / 'herder.log'}")
            time.sleep(0.05)

        def settled() -> bool:  # no recycle under way
            st = run.samples[-1] if run.samples else {}
            return st.get("ready") == args.workers and not st.get("starting") and not st.get("leaving")

        wait_for("the last recycles to finish", settled, timeout=60, interval=0.2)
        time.sleep(1.5)  # a quiet tail
        stop_sampling.set()
        sampler.join(10)
        run.final = status(state) or {}
        ids = [x.decode() for x in r.lrange(DONE, 0, -1)]
        run.done, run.unique = len(ids), len(set(ids))
        run.failed = Queue(connection=r).failed_job_registry.count
        leaked = [float(x) - t0_wall for x in r.lrange(LEAKED, 0, -1)]
        run.leak_from, run.leak_to = (min(leaked), max(leaked)) if leaked else (0.0, 0.0)
        run.load = (run.load[0], os.getloadavg()[0])
        sigterm_wall = time.time()
        herder.send_signal(signal.SIGTERM)
        try:
            run.exit_code = herder.wait(60)
        except subprocess.TimeoutExpired as exc:
            raise BenchError(f"herder did not exit within 60 s of SIGTERM; see {tmp / 'herder.log'}") from exc
        run.log_min_ready, run.start_seconds = replay_log(
            (tmp / "herder.log").read_text(errors="replace"), sigterm_wall
        )
    finally:
        stop_sampling.set()
        if sampler:
            sampler.join(10)
        if herder:
            procs.stop(herder, 60, spare={server.pid})
        end_all(procs, server)
    return run


def stream(r: Redis, args: argparse.Namespace, t0: float) -> None:
    """Enqueue at a steady rate: the short jobs, then a stretch where every 3rd job leaks."""
    q = Queue(connection=r)
    total = args.jobs + 3 * args.leak_jobs
    for i in range(total):
        if (delay := t0 + i / args.rate - time.monotonic()) > 0:
            time.sleep(delay)
        if i >= args.jobs and (i - args.jobs) % 3 == 0:
            q.enqueue("recycle_jobs.leak", args.job_seconds, args.leak_mb)
        else:
            q.enqueue("recycle_jobs.work", args.job_seconds)


def sample_loop(state: Path, t0: float, interval: float, run: Run, stop: threading.Event) -> None:
    """`herder status --json` every `interval` seconds (or back to back, if one takes longer)."""
    next_at = time.monotonic()
    while not stop.is_set():
        st = status(state)
        if st:
            states = [w["state"] for w in st["workers"]]
            recycled = st["totals"]["recycled"]
            run.samples.append(
                {
                    "t": time.monotonic() - t0,
                    "desired": st["desired"],
                    "ready": sum(s in READY for s in states),
                    "starting": states.count("starting"),
                    "leaving": sum(s in LEAVING for s in states),
                    "by_jobs": recycled.get(MAX_JOBS, 0),
                    "by_memory": recycled.get(MAX_MEMORY, 0),
                    "recycled": sum(recycled.values()),
                    "killed": st["totals"]["killed"],
                    "backlog": sum(q["backlog"] for q in st["queues"]),
                    "max_rss_mb": max((w["rss"] or 0 for w in st["workers"]), default=0) / 2**20,
                }
            )
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))
        next_at = max(next_at, time.monotonic())


def replay_log(log: str, until_wall: float) -> tuple[int | None, list[float]]:
    """Replay the workers' state changes in herder's log: the fewest ready workers at any
    moment from the first time the whole fleet was ready until `until_wall` (the SIGTERM),
    and how long each later worker (a replacement) took from spawned to ready."""
    states: dict[str, str] = {}
    spawned: dict[str, float] = {}
    starts: list[float] = []
    target: int | None = None
    lowest: int | None = None
    for line in log.splitlines():
        if target is None and (m := re.search(r"all (\d+) workers ready", line)):
            target = int(m.group(1))
            lowest = sum(s in READY for s in states.values())
            continue
        m = MOVE_RE.match(line)
        if not m:
            continue
        when = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if when >= until_wall:
            break
        pid, old, new = m.group(2), m.group(3), m.group(4)
        states[pid] = new
        if target is not None and old == "spawned":
            spawned[pid] = when
        elif old == "starting" and new in READY and pid in spawned:
            starts.append(when - spawned[pid])
        if target is not None:
            ready = sum(s in READY for s in states.values())
            lowest = ready if lowest is None else min(lowest, ready)
    return lowest, starts


def render(args: argparse.Namespace, run: Run) -> tuple[str, bool]:
    """The markdown summary, and whether the run showed what it should."""
    s = run.samples
    final = run.final.get("totals", {})
    by_jobs = final.get("recycled", {}).get(MAX_JOBS, 0)
    by_memory = final.get("recycled", {}).get(MAX_MEMORY, 0)
    other = {k: v for k, v in final.get("recycled", {}).items() if k not in (MAX_JOBS, MAX_MEMORY)}
    min_ready = min((x["ready"] for x in s), default=None)
    most = max((x["ready"] + x["starting"] + x["leaving"] for x in s), default=None)
    max_rss = max((x["max_rss_mb"] for x in s), default=0.0)
    max_backlog = max((x["backlog"] for x in s), default=0)
    starts = run.start_seconds
    gaps = [b["t"] - a["t"] for a, b in zip(s, s[1:], strict=False)]
    mean_gap = sum(gaps) / len(gaps) if gaps else 0.0
    ok = (
        min_ready is not None
        and min_ready >= args.workers
        and (run.log_min_ready is None or run.log_min_ready >= args.workers)
        and run.done == run.unique == run.jobs
        and run.failed == 0
        and final.get("killed", 1) == 0
        and run.exit_code == 0
    )
    memory = (
        f"; then {3 * args.leak_jobs} more at the same rate, every 3rd leaking {args.leak_mb} MB "
        f"(`--max-memory {args.max_memory} --max-memory-hard {args.max_memory_hard}`)"
        if args.leak_jobs
        else ""
    )
    lines = [
        f"## Recycling: {args.workers} workers, max {args.max_jobs} (+0-{args.max_jobs_jitter}) jobs each",
        "",
        f"Command: `scripts/bench/run recycle --jobs {args.jobs} --rate {args.rate:g} "
        f"--job-seconds {args.job_seconds:g} --leak-jobs {args.leak_jobs} --leak-mb {args.leak_mb}`",
        "",
        f"`herder run --workers {args.workers} --max-jobs {args.max_jobs} --max-jobs-jitter "
        f"{args.max_jobs_jitter} --recycle-share {args.recycle_share:g}` on a private redis-server; "
        f"{args.jobs} jobs of {args.job_seconds * 1000:.0f} ms enqueued at {args.rate:g}/s{memory}. "
        f"Sampled herder's status (`herder status --json`) {len(s)} times, every {mean_gap:.2f} s "
        "on average; "
        "the lowest ready count is also replayed from herder's log (1 ms timestamps).",
        "",
        "| | |",
        "|---|---:|",
        f"| recycled after max jobs | {by_jobs} |",
        f"| recycled after max memory | {by_memory} |",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(other.items())]
    lines += [
        f"| ready workers, lowest (status samples) | {min_ready} (target {args.workers}) |",
        f"| ready workers, lowest (herder's log) | {run.log_min_ready} |",
        f"| workers at once, most (ready + starting + stopping) | {most} |",
        f"| jobs done | {run.done} of {run.jobs} ({run.unique} distinct, {run.failed} failed) |",
        f"| workers killed | {final.get('killed')} |",
        "| replacement spawned to ready, median (max) | "
        + (f"{statistics.median(starts):.2f} s ({max(starts):.2f} s) |" if starts else "n/a |"),
        f"| jobs waiting in the queue, most | {max_backlog} |",
        f"| worker RSS: fresh, largest seen | {run.baseline_rss_mb:.0f} MB, {max_rss:.0f} MB |",
        f"| duration, first job enqueued to last job done | {fmt(run.done_at)} |",
        f"| herder's exit code on SIGTERM | {run.exit_code} |",
        f"| machine: cores, load average (1 min) at start and end | {os.cpu_count()}, "
        f"{run.load[0]:.1f} and {run.load[1]:.1f} |",
    ]
    if min_ready is not None and min_ready < args.workers:
        lines += ["", f"**Ready workers dipped to {min_ready}, below the target of {args.workers}.**"]
    return "\n".join(lines) + "\n", ok


def fmt(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:.1f} s"


def draw(run: Run, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = run.samples
    t = [x["t"] for x in s]
    ready = [x["ready"] for x in s]
    starting = [x["ready"] + x["starting"] for x in s]
    leaving = [x["ready"] + x["starting"] + x["leaving"] for x in s]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 4), height_ratios=[2, 1])
    top.fill_between(t, 0, ready, step="post", color="tab:green", alpha=0.55, linewidth=0, label="ready")
    top.fill_between(
        t, ready, starting, step="post", color="tab:blue", alpha=0.6, linewidth=0, label="starting"
    )
    top.fill_between(
        t, starting, leaving, step="post", color="tab:orange", alpha=0.7, linewidth=0, label="stopping"
    )
    top.step(t, [x["desired"] for x in s], where="post", color="black", linestyle="--", label="target")
    top.set_ylim(0, args.workers + 3)
    top.set_ylabel("workers")
    top.legend(loc="upper left", ncol=4, fontsize="small", frameon=False)
    top.set_title(
        f"herder --workers {args.workers} --max-jobs {args.max_jobs} --max-jobs-jitter {args.max_jobs_jitter}"
        + (f" --max-memory {args.max_memory}" if args.leak_jobs else "")
        + f": {run.jobs} jobs of {args.job_seconds * 1000:.0f} ms",
        fontsize="medium",
    )
    bottom.step(t, [x["by_jobs"] for x in s], where="post", color="tab:purple", label="after max jobs")
    if args.leak_jobs:
        bottom.step(t, [x["by_memory"] for x in s], where="post", color="tab:red", label="after max memory")
    bottom.set_ylabel("recycled")
    bottom.set_xlabel("seconds since the first job")
    bottom.legend(loc="upper left", fontsize="small", frameon=False)
    for ax in (top, bottom):
        if args.leak_jobs:
            ax.axvspan(run.leak_from, run.leak_to, color="grey", alpha=0.12, linewidth=0)
        ax.grid(alpha=0.3)
        ax.set_xlim(0, t[-1] if t else 1)
    if args.leak_jobs:
        top.text((run.leak_from + run.leak_to) / 2, 0.4, "leaking\njobs ran", fontsize="small", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
