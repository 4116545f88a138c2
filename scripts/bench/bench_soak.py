"""The long run: many no-op jobs through one pool with recycling off, and what herder holds
afterwards. Sampled once a second: jobs done, the master's RSS, every worker's RSS, open
descriptors and threads (master and workers), and herder's keys in Redis. The baseline is taken
when the checkpoint's share of the jobs is done (50,000 of 500,000 by default); at the end, each
figure is compared with it against the bounds below, scaled to the run's length.

    scripts/bench/run soak                          # 500,000 jobs, 8 one-job workers
    scripts/bench/run soak --jobs 100000 --threads 4
    scripts/bench/run soak --jobs 50000 --json out.json   # what tests/test_soak.py runs
    scripts/bench/run soak --png docs/soak.png            # the curves (the bench extra: matplotlib)

Exit 0 when every bound held, 1 when one did not (the report says which), 2 on a set-up error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
from redis import Redis
from rq import Queue

from bench_base import BenchError, say, wait_for
from bench_commands import herder_argv, herder_master
from bench_procs import Processes, end_all, start_redis

SUMMARY = "the long run: what herder holds after 500,000 jobs"
QUEUE = "soak"
JOB_MODULE = "herder_soak_jobs"
BATCH = 5000  # jobs enqueued at once, in one pipeline
BACKLOG = 20_000  # enqueue more while fewer than this wait: the queue never holds the whole run
# The bounds for the full run (500,000 jobs, baseline after 50,000), scaled by the jobs between
# the baseline and the end: a leak is bytes per job, so a tenth of the run gets a tenth of the room.
FULL_RUN_JOBS = 450_000
MASTER_RSS_BOUND = 5 * 2**20
WORKER_RSS_BOUND = 2 * 2**20
RSS_FLOOR = 2 * 2**20  # the least room a bound gets: allocator arenas move by this much, leak or not


@dataclass
class Sample:
    t: float  # seconds since the first job was enqueued
    done: int
    master_rss: int
    worker_rss: dict[int, int]  # pid: bytes
    fds: int  # master and workers together
    threads: int  # likewise
    herder_keys: int
    master_fds: int = 0
    worker_fds: dict[int, int] = field(default_factory=dict)  # pid: open descriptors


@dataclass
class Verdict:
    held: bool = True
    lines: list[str] = field(default_factory=list)

    def check(self, ok: bool, text: str) -> None:
        self.held &= ok
        self.lines.append(f"{'ok  ' if ok else 'FAIL'} {text}")


def herder_keys(conn: Redis) -> int:
    return sum(1 for _ in conn.scan_iter(match="herder:*", count=1000))


class Fleet:
    """The herder under test and what psutil sees of it."""

    def __init__(self, workdir: Path, procs: Processes, url: str, args: argparse.Namespace) -> None:
        self.state_dir = workdir / "state"
        self.procs = procs
        argv = herder_argv(url, queue=QUEUE, workers=args.workers, threads=args.threads, path=workdir,
                           state_dir=self.state_dir, extra=args.herder_args)  # fmt: skip
        self.proc = procs.start(argv, workdir / "herder.log")
        self.workers = args.workers

    def status(self) -> dict:
        from herder.supervisor.ctl import client

        return client.call(str(self.state_dir), {"cmd": "status"})

    def master(self) -> psutil.Process:
        master = herder_master(self.proc.pid)
        if master is None:
            raise BenchError("no master under the watchdog")
        return master

    def sample(self, status: dict, t: float, done: int, keys: int) -> Sample:
        master = self.master()
        procs = [master]
        for row in status["workers"]:
            try:
                procs.append(psutil.Process(row["pid"]))
            except psutil.NoSuchProcess:
                pass
        threads = 0
        rss: dict[int, int] = {}
        fds: dict[int, int] = {}
        for p in procs:
            with p.oneshot():
                fds[p.pid] = p.num_fds()
                threads += p.num_threads()
                if p.pid != master.pid:
                    rss[p.pid] = p.memory_info().rss
        master_fds = fds.pop(master.pid)
        return Sample(t, done, master.memory_info().rss, rss, master_fds + sum(fds.values()), threads, keys,
                      master_fds, fds)  # fmt: skip


def measure(args: argparse.Namespace, workdir: Path) -> tuple[list[Sample], Sample, Verdict]:
    (workdir / f"{JOB_MODULE}.py").write_text("def noop():\n    return None\n")
    sys.path.insert(0, str(workdir))
    procs = Processes()
    server = fleet = None
    try:
        server, conn = start_redis(workdir, procs)
        fleet = Fleet(workdir, procs, server.url, args)
        wait_for("every worker ready", lambda: _all_ready(fleet), 60)
        queue = Queue(QUEUE, connection=conn)
        enqueued, samples, baseline = 0, [], None
        checkpoint = int(args.jobs * args.checkpoint)
        t0 = last_sample = time.monotonic()
        while True:
            if enqueued < args.jobs and queue.count < BACKLOG:
                n = min(BATCH, args.jobs - enqueued)
                queue.enqueue_many([Queue.prepare_data(f"{JOB_MODULE}.noop", result_ttl=0) for _ in range(n)])
                enqueued += n
                continue
            now = time.monotonic()
            if now - last_sample < args.interval:
                time.sleep(min(0.1, args.interval - (now - last_sample)))
                continue
            last_sample = now
            status = fleet.status()
            done = status["jobs"]["ok"] + status["jobs"]["failed"]
            sample = fleet.sample(status, round(now - t0, 1), done, herder_keys(conn))
            samples.append(sample)
            if baseline is None and done >= checkpoint:
                baseline = sample
            if args.progress:
                mib = sample.master_rss / 2**20
                say(f"{sample.t:7.1f}s {done:>8} jobs  master {mib:6.1f} MiB  fds {sample.fds}  "
                    f"threads {sample.threads}  herder keys {sample.herder_keys}")  # fmt: skip
            if done >= args.jobs:
                break
            if status["jobs"]["failed"]:
                raise BenchError(f"{status['jobs']['failed']} no-op jobs failed: see {workdir}/herder.log")
        if baseline is None:
            raise BenchError("the run ended before its checkpoint")
        # The last sample, taken once the pool is idle again (no job in flight to count against it).
        wait_for("the pool idle", lambda: _all_ready(fleet), 30)
        status = fleet.status()
        end = fleet.sample(status, round(time.monotonic() - t0, 1), status["jobs"]["ok"], herder_keys(conn))
        samples.append(end)
        return samples, baseline, judge(args, baseline, end)
    finally:
        if fleet is not None and server is not None:
            procs.stop(fleet.proc, 60, spare={server.pid})
        end_all(procs, server)


def _all_ready(fleet: Fleet) -> bool:
    try:
        status = fleet.status()
    except (OSError, ValueError):
        return False
    return status.get("actual") == fleet.workers and all(w["state"] == "idle" for w in status["workers"])


def judge(args: argparse.Namespace, base: Sample, end: Sample) -> Verdict:
    share = (end.done - base.done) / FULL_RUN_JOBS
    master_bound = max(RSS_FLOOR, MASTER_RSS_BOUND * share)
    worker_bound = max(RSS_FLOOR, WORKER_RSS_BOUND * share)
    v = Verdict()
    grew = end.master_rss - base.master_rss
    v.check(grew < master_bound, f"master RSS {grew / 2**20:+.2f} MiB (bound {master_bound / 2**20:.2f})")
    same = set(base.worker_rss) & set(end.worker_rss)
    v.check(
        len(same) == args.workers,
        f"the same {len(same)} of {args.workers} workers throughout (recycling off)",
    )
    worst = max((end.worker_rss[p] - base.worker_rss[p] for p in same), default=0)
    v.check(
        worst < worker_bound, f"worst worker RSS {worst / 2**20:+.2f} MiB (bound {worker_bound / 2**20:.2f})"
    )
    v.check(
        end.master_fds <= base.master_fds, f"master's open descriptors {base.master_fds} -> {end.master_fds}"
    )
    # A worker's Redis pool opens a connection the first time a job thread's call overlaps the
    # lease renewal's (redis-py opens one per concurrent user, once): at most one per job thread,
    # whenever in the run it happens. A leak grows with the jobs, past that.
    grew = {p: end.worker_fds[p] - base.worker_fds[p] for p in same if p in base.worker_fds}
    v.check(
        all(n <= args.threads for n in grew.values()),
        f"workers' open descriptors {base.fds - base.master_fds} -> {end.fds - end.master_fds} "
        f"(each at most {args.threads} more: {sorted(grew.values())})",
    )
    v.check(end.threads <= base.threads, f"threads {base.threads} -> {end.threads}")
    v.check(
        end.herder_keys <= base.herder_keys, f"herder keys in Redis {base.herder_keys} -> {end.herder_keys}"
    )
    return v


def draw(runs: list[tuple[str, list[Sample]]], path: Path) -> None:
    """Memory, descriptors, threads and herder's keys against jobs done, one column per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(runs), figsize=(5 * len(runs), 5), sharex="col", squeeze=False)
    for col, (title, samples) in enumerate(runs):
        done = [s.done / 1000 for s in samples]
        top, bottom = axes[0][col], axes[1][col]
        top.plot(done, [s.master_rss / 2**20 for s in samples], label="master RSS")
        top.plot(
            done, [max(s.worker_rss.values(), default=0) / 2**20 for s in samples], label="largest worker RSS"
        )
        top.set_ylabel("MiB")
        top.set_ylim(bottom=0)
        top.set_title(title, fontsize="medium")
        top.legend(loc="lower right", fontsize="small", frameon=False)
        bottom.plot(done, [s.fds for s in samples], label="open descriptors")
        bottom.plot(done, [s.threads for s in samples], label="threads")
        bottom.plot(done, [s.herder_keys for s in samples], label="herder keys in Redis")
        bottom.set_ylim(bottom=0)
        bottom.set_xlabel("jobs done (thousands)")
        bottom.legend(loc="lower right", fontsize="small", frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=500_000, help="no-op jobs in the run")
    p.add_argument("--workers", type=int, default=8, help="herder's --workers")
    p.add_argument("--threads", type=int, default=1, help="job threads per worker")
    p.add_argument("--checkpoint", type=float, default=0.1, help="share of the jobs done at the baseline")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("--json", help="write the samples, the baseline and the verdict here")
    p.add_argument("--png", help="draw the curves into this PNG (with --also, one column per run)")
    p.add_argument("--also", help="the --json of another run to draw beside this one (e.g. threaded)")
    p.add_argument("--progress", action="store_true", help="print each sample")
    p.add_argument("--herder-args", type=str, default="", help="more flags for herder run")


def run(args: argparse.Namespace) -> int:
    args.herder_args = args.herder_args.split()
    workdir = Path(tempfile.mkdtemp(prefix="herder-soak-"))
    try:
        samples, baseline, verdict = measure(args, workdir)
    except BenchError as exc:
        say(f"soak: {exc}")
        return 2
    took = samples[-1].t
    print(f"soak: {args.jobs} jobs, {args.workers} workers x {args.threads} threads, {took:.0f} s "
          f"({args.jobs / took:.0f} jobs/s); baseline at {baseline.done} jobs")  # fmt: skip
    print(f"{'t (s)':>7} {'jobs':>8} {'master MiB':>10} {'workers MiB (max)':>17} {'fds':>5} {'threads':>7} "
          f"{'herder keys':>11}")  # fmt: skip
    step = max(1, len(samples) // 20)
    for s in [*samples[::step], samples[-1]]:
        worst = max(s.worker_rss.values(), default=0)
        print(f"{s.t:7.1f} {s.done:8d} {s.master_rss / 2**20:10.2f} {worst / 2**20:17.2f} {s.fds:5d} "
              f"{s.threads:7d} {s.herder_keys:11d}")  # fmt: skip
    for line in verdict.lines:
        print(line)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "samples": [asdict(s) for s in samples],
                    "baseline": asdict(baseline),
                    "held": verdict.held,
                    "verdict": verdict.lines,
                },
                indent=1,
            )  # fmt: skip
        )
    shutil.rmtree(workdir, ignore_errors=True)
    if args.png:
        title = (
            f"{args.jobs:,} jobs, {args.workers} workers x {args.threads} thread{'s' * (args.threads > 1)}"
        )
        runs = [(title, samples)]
        if args.also:
            other = json.loads(Path(args.also).read_text())
            runs.append((other.get("title", args.also), [Sample(**s) for s in other["samples"]]))
        draw(runs, Path(args.png))
    return 0 if verdict.held else 1
