"""herder's advice, applied: does each piece improve the figure it is about?

    scripts/bench/run advice --markdown /tmp/advice.md

Three workloads, each run twice on a fresh private Redis with the same load: first with the
settings a user might start from, until `herder advise` says what it would change (the bench
reads it from `herder status`'s `advice`), then again with that change applied as flags.

- threads: `--workers 8`, jobs that each sleep 0.5 s arriving at 10 a second for 60 s. Figure:
  the tree's memory (USS and PSS summed over every process), the mean of a reading every 2 s
  under load; and the jobs served, and their p95 wait, to show the throughput is the same.
- recycling: `--workers 2`, 600 jobs at once that each keep 1 MiB alive and take 0.2 s.
  Figure: the largest RSS any worker reached (read every 0.5 s).
- bounds: `--min-workers 1 --max-workers 2 --max-wait 2`, a burst of 300 jobs of 0.3 s at once.
  Figure: how long jobs waited (RQ's enqueued_at to started_at): the sum of the waits over the 2 s
  target, the p95 wait, and the worker-seconds spent.

Not a test, and no assertion: run by hand; docs/benchmarks.md ("Advice, applied") reads a run.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from redis import Redis
from rq import Queue
from rq.job import Job

from bench_base import BenchError, say, wait_for
from bench_commands import herder_argv
from bench_procs import Processes, start_redis
from bench_report import key_table, publish
from bench_source import run_each, scratch

SUMMARY = "herder's advice applied: memory for threads, RSS for recycling, waiting for bounds"
QUEUE = "default"
MB = 1024 * 1024
JOB_SOURCE = '''"""Written by scripts/bench advice: an I/O-bound job, and one that leaks."""
import time

_kept = []


def wait(seconds):
    time.sleep(seconds)


def leak(megabytes, seconds):
    time.sleep(seconds)
    block = bytearray(megabytes * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # every page touched: it counts in RSS
    _kept.append(block)
'''

# Each workload: the flags it starts from, the advice it expects (kind, reason).
WORKLOADS = {
    "threads": (["--workers", "8"], ("threads", "off_cpu")),
    "recycling": (["--workers", "2"], ("recycling", "rss_growth")),
    "bounds": (["--min-workers", "1", "--max-workers", "2", "--max-wait", "2"], ("bounds", "held_at_max")),
}


def status(state_dir: Path) -> dict[str, Any] | None:
    from herder.supervisor.ctl import client

    with contextlib.suppress(OSError, ValueError):
        reply = client.call(str(state_dir), {"cmd": "status"}, timeout=10)
        return reply if reply.get("ok") else None
    return None


def workers(top: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [
            p
            for p in psutil.Process(top).children(recursive=True)
            if "herder-worker" in " ".join(p.cmdline())
        ]
    return []


def tree_memory(top: int) -> tuple[float, float]:
    """USS and PSS summed over every process of the tree, in MB."""
    uss = pss = 0.0
    with contextlib.suppress(psutil.Error):
        top_proc = psutil.Process(top)
        for p in [top_proc, *top_proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                m = p.memory_full_info()
                uss, pss = uss + m.uss / MB, pss + m.pss / MB
    return uss, pss


def flags_of(change: dict[str, Any]) -> list[str]:
    """The advice's settings as `herder run` flags."""
    out: list[str] = []
    for key, value in change.items():
        out += ["--" + key.replace("_", "-"), str(value)]
    return out


def with_change(base: list[str], change: dict[str, Any]) -> list[str]:
    """`base` with each flag the change sets replaced; a fixed count and bounds exclude each other."""
    drop = {"--" + k.replace("_", "-") for k in change}
    if "workers" in change:
        drop |= {"--min-workers", "--max-workers"}
    if "max_workers" in change or "min_workers" in change:
        drop.add("--workers")
    out, skip = [], False
    for i, arg in enumerate(base):
        if skip:
            skip = False
            continue
        if arg in drop:
            skip = i + 1 < len(base)
            continue
        out.append(arg)
    return out + flags_of(change)


class Load:
    """The workload's jobs, fed on a thread of its own; what they measured once they are done."""

    def __init__(self, kind: str, r: Redis, seconds: float) -> None:
        self.kind, self.r, self.seconds = kind, r, seconds
        self.q = Queue(QUEUE, connection=r)
        self.ids: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.feed, daemon=True)

    def enqueue(self, func: str, *args: Any) -> None:
        self.ids.append(self.q.enqueue(func, *args, result_ttl=3600).id)

    def feed(self) -> None:
        if self.kind == "threads":
            end = time.monotonic() + self.seconds
            while time.monotonic() < end and not self.stop.is_set():
                for _ in range(5):
                    self.enqueue("bench_advice_jobs.wait", 0.5)
                self.stop.wait(0.5)
        elif self.kind == "recycling":
            for _ in range(600):
                self.enqueue("bench_advice_jobs.leak", 1, 0.2)
        else:
            for _ in range(300):
                self.enqueue("bench_advice_jobs.wait", 0.3)

    def finished(self) -> int:
        return self.r.zcard(f"rq:finished:{QUEUE}")

    def waits(self) -> list[float]:
        out = []
        for job in Job.fetch_many(self.ids, connection=self.r):
            if job is not None and job.started_at and job.enqueued_at:
                out.append((job.started_at - job.enqueued_at).total_seconds())
        return sorted(out)


def p95(xs: list[float]) -> float:
    return xs[int(0.95 * (len(xs) - 1))] if xs else 0.0


def phase(kind: str, flags: list[str], args: argparse.Namespace, tmp: Path, env: dict[str, str],
          procs: Processes, name: str) -> dict[str, Any]:  # fmt: skip
    """One run of the workload under `flags`: its figures, and the advice herder gave."""
    server, r = start_redis(tmp / f"redis-{kind}-{name}", procs)
    state = tmp / f"state-{kind}-{name}"
    log = tmp / f"{kind}-{name}.log"
    argv = herder_argv(
        server.url, queue=QUEUE, path=tmp / "jobs", state_dir=state, scheduler=False, extra=flags
    )
    proc = procs.start(argv, log, env)
    try:
        wait_for(f"herder ready ({kind}, {name})", lambda: (s := status(state)) and s["running"] or None,
                 args.timeout, 0.2)  # fmt: skip
        load = Load(kind, r, args.seconds)
        started = time.monotonic()
        load.thread.start()
        mem: list[tuple[float, float]] = []
        peak = 0
        worker_seconds = 0.0
        advice: dict[str, Any] | None = None
        expected = WORKLOADS[kind][1]
        last = started
        while True:
            now = time.monotonic()
            ws = workers(proc.pid)
            worker_seconds += len(ws) * (now - last)
            last = now
            for w in ws:
                with contextlib.suppress(psutil.Error):
                    peak = max(peak, w.memory_info().rss)
            if kind == "threads" and now - started > 5 and int(now - started) % 2 == 0:
                mem.append(tree_memory(proc.pid))
            s = status(state)
            if s and advice is None:
                advice = next(
                    (a for a in s["advice"] if (a["kind"], a["reason"]) == expected and a["change"]), None
                )
            fed = not load.thread.is_alive()
            if fed and load.finished() >= len(load.ids):
                break
            if now - started > args.timeout:
                raise BenchError(
                    f"{kind} ({name}): the jobs did not finish within {args.timeout:g} s; see {log}"
                )
            time.sleep(0.5)
        took = time.monotonic() - started
        waits = load.waits()
        out: dict[str, Any] = {
            "jobs": len(load.ids),
            "seconds": round(took, 1),
            "jobs/s": round(len(load.ids) / took, 1),
        }
        if kind == "threads":
            out["USS, MB"] = round(sum(u for u, _ in mem) / len(mem), 1) if mem else None
            out["PSS, MB"] = round(sum(p for _, p in mem) / len(mem), 1) if mem else None
            out["p95 wait, s"] = round(p95(waits), 2)
        elif kind == "recycling":
            out["peak worker RSS, MB"] = round(peak / MB, 1)
        else:
            out["waited over 2 s, s"] = round(sum(max(0.0, w - 2.0) for w in waits), 1)
            out["p95 wait, s"] = round(p95(waits), 2)
            out["worker-seconds"] = round(worker_seconds)
        out["advice"] = advice
        return out
    finally:
        procs.stop(proc, 30)
        server.stop()


def run_one(kind: str, args: argparse.Namespace, tmp: Path, env: dict[str, str], procs: Processes) -> dict:
    base = WORKLOADS[kind][0]
    before = phase(kind, base, args, tmp, env, procs, "before")
    advice = before.pop("advice")
    if advice is None:
        raise BenchError(f"{kind}: no {WORKLOADS[kind][1]} advice given")
    say(f"{kind}: advised {advice['change']}: {advice['text']}")
    after_flags = with_change(base, advice["change"])
    after = phase(kind, after_flags, args, tmp, env, procs, "after")
    after.pop("advice")
    return {"before": before, "after": after, "advice": advice, "flags": (base, after_flags)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=60.0, help="threads: seconds of load")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds each run may take")
    p.add_argument("--only", help="comma-separated workloads: threads,recycling,bounds")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    keys = args.only.split(",") if args.only else list(WORKLOADS)
    tmp = scratch("herder-advice-", "bench_advice_jobs.py", JOB_SOURCE)
    results = run_each(keys, tmp, lambda key, env, procs: run_one(key, args, tmp, env, procs))
    if results is None:
        return 1
    lines = ["## Advice, applied", ""]
    for kind in keys:
        res = results[kind]
        base, after = res["flags"]
        sure = res["advice"]["confidence"]
        rows = [k for k in res["before"] if k in res["after"]]
        lines += [
            f"### {kind}",
            "",
            f"Advice after the first run (`{' '.join(base)}`): {res['advice']['text']} "
            f"(over {sure['jobs']} jobs, {sure['minutes']} min).",
            "",
            *key_table({"before": " ".join(base), "after": " ".join(after)}, res, rows),
            "",
        ]
    publish("\n".join(lines), args.markdown)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
