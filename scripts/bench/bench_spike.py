"""The autoscaling spike scenario: what herder does when a burst lands on a quiet queue.

    .venv/bin/pip install -e '.[bench]'
    scripts/bench/run spike --png docs/scaling-spike.png --markdown /tmp/spike.md

Starts a private redis-server and `herder run --min-workers 1 --max-workers N`, enqueues a
burst of short jobs at once, and samples `herder status --json` every 0.25 s: the queue
length, its growth rate, desired and actual workers. Draws them over time (matplotlib)
and reports the time from the spike to max workers and from the drained queue back to
min, next to what KEDA's defaults would give for the same load. Not a test: run by hand.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rq import Queue

from bench_base import BenchError, say, wait_for
from bench_commands import herder_argv, herder_ctl_argv
from bench_procs import Processes, child_env, end_all, start_redis
from bench_report import publish

SUMMARY = "autoscaling: a burst on a quiet queue, beside KEDA"
JOB_SOURCE = "import time\n\n\ndef work(seconds):\n    time.sleep(seconds)\n"
# KEDA's Redis-list scaler defaults: poll every 30 s; scale to zero/min after a 300 s
# cooldown, and the HPA's default scale-down stabilization window is also 300 s.
KEDA_POLLING = 30.0
KEDA_COOLDOWN = 300.0


@dataclass
class Timeline:
    """Samples of `herder status --json`, and the moments that matter, in seconds since sampling began."""

    samples: list[dict] = field(default_factory=list)
    spike_at: float = 0.0
    max_at: float | None = None  # max workers reached
    drained_at: float | None = None  # queue empty, nothing running
    min_at: float | None = None  # back to min workers


def status(state: Path) -> dict | None:
    r = subprocess.run(
        herder_ctl_argv(state, "status", "--json"),
        capture_output=True,
        text=True,
        env=child_env(),
    )
    return json.loads(r.stdout) if r.returncode in (0, 3) else None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=600, help="jobs in the burst")
    p.add_argument("--job-seconds", type=float, default=0.05, help="each job's sleep")
    p.add_argument("--max-workers", type=int, default=6, help="herder's --max-workers (--min-workers is 1)")
    p.add_argument(
        "--scale-down-delay", type=float, default=10.0, help="herder's --scale-down-delay, seconds"
    )
    p.add_argument("--png", help="draw the timeline into this PNG")
    p.add_argument("--markdown", help="also write the report here")


def run(args: argparse.Namespace) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="herder-spike-"))
    try:
        tl = measure(args, tmp)
    except BenchError as exc:
        say(f"error: {exc}; logs kept in {tmp}")
        return 1

    to_max = (tl.max_at - tl.spike_at) if tl.max_at is not None else None
    to_min = (tl.min_at - tl.drained_at) if tl.min_at is not None and tl.drained_at is not None else None
    drain = (tl.drained_at - tl.spike_at) if tl.drained_at is not None else None
    lines = [
        "## Autoscaling: a spike on a quiet queue",
        "",
        "Command: `scripts/bench/run spike "
        f"--jobs {args.jobs} --job-seconds {args.job_seconds} "
        f"--max-workers {args.max_workers} --scale-down-delay {args.scale_down_delay:g}`",
        "",
        f"{args.jobs} jobs of {args.job_seconds * 1000:.0f} ms enqueued at once; "
        f"min 1, max {args.max_workers} workers, scale-down delay {args.scale_down_delay:g} s; "
        "sampled from `herder status --json` every 0.25 s.",
        "",
        "| | herder (measured) | KEDA defaults (computed) |",
        "|---|---:|---:|",
        f"| spike to max workers | {fmt(to_max)} "
        f"| up to {KEDA_POLLING:.0f} s (one polling interval) + pod start |",
        f"| spike to queue drained | {fmt(drain)} | |",
        f"| drained to min workers | {fmt(to_min)} | {KEDA_COOLDOWN:.0f} s (cooldownPeriod) |",
    ]
    publish("\n".join(lines) + "\n", args.markdown)
    if args.png:
        draw(tl.samples, tl.spike_at, args, Path(args.png))
        print(f"drew {args.png}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0 if to_max is not None and to_min is not None else 1


def measure(args: argparse.Namespace, tmp: Path) -> Timeline:
    """Run herder on a private Redis, land the burst, and sample until it is back at min workers."""
    (tmp / "jobs").mkdir()
    (tmp / "jobs" / "spike_jobs.py").write_text(JOB_SOURCE)
    procs = Processes()
    state = tmp / "state"
    herder = None
    tl = Timeline()
    server, r = start_redis(tmp, procs)
    try:
        scaling = ["--min-workers", "1", "--max-workers", str(args.max_workers)]
        scaling += ["--scale-down-delay", str(args.scale_down_delay)]
        argv = herder_argv(server.url, path=tmp / "jobs", state_dir=state, extra=scaling)
        herder = procs.start(argv, tmp / "herder.log")

        def running() -> bool:
            st = status(state)
            return bool(st and st["running"])

        wait_for("herder to report running", running, timeout=60, interval=0.2)
        t0 = time.monotonic()

        def sample() -> None:
            st = status(state)
            if st:
                q = st["queues"][0] if st["queues"] else {"backlog": 0, "growth": 0.0, "running": 0}
                tl.samples.append(
                    {
                        "t": time.monotonic() - t0,
                        "backlog": q["backlog"],
                        "growth": q["growth"],
                        "running": q["running"],
                        "desired": st["desired"],
                        "actual": st["actual"],
                    }
                )

        for _ in range(8):  # 2 s of quiet before the spike
            sample()
            time.sleep(0.25)
        tl.spike_at = time.monotonic() - t0
        q = Queue(connection=r)
        with r.pipeline() as pipe:
            for _ in range(args.jobs):
                q.enqueue("spike_jobs.work", args.job_seconds, pipeline=pipe)
            pipe.execute()
        while True:
            sample()
            s = tl.samples[-1]
            if tl.max_at is None and s["actual"] >= args.max_workers:
                tl.max_at = s["t"]
            if tl.drained_at is None and tl.max_at is not None and s["backlog"] == 0 and s["running"] == 0:
                tl.drained_at = s["t"]
            if tl.drained_at is not None and s["actual"] <= 1:
                tl.min_at = s["t"]
                break
            if s["t"] > tl.spike_at + 120 + args.scale_down_delay:
                break
            time.sleep(0.25)
        for _ in range(8):
            sample()
            time.sleep(0.25)
    finally:
        if herder:
            procs.stop(herder, 60, spare={server.pid})
        end_all(procs, server)
    return tl


def fmt(seconds: float | None) -> str:
    return "not reached" if seconds is None else f"{seconds:.1f} s"


def draw(samples: list[dict], spike_at: float, args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s["t"] - spike_at for s in samples]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 5.5), height_ratios=[1, 1])
    top.plot(t, [s["backlog"] for s in samples], color="tab:blue", label="queue length")
    top.set_ylabel("jobs waiting", color="tab:blue")
    growth_axis = top.twinx()
    growth_axis.plot(t, [s["growth"] for s in samples], color="tab:orange", label="growth rate")
    growth_axis.set_ylabel("growth (jobs/s)", color="tab:orange")
    top.set_title(
        f"herder: {args.jobs} jobs of {args.job_seconds * 1000:.0f} ms land at t=0 "
        f"(min 1, max {args.max_workers}, scale-down delay {args.scale_down_delay:g} s)"
    )
    bottom.step(t, [s["desired"] for s in samples], where="post", color="tab:green", label="desired workers")
    bottom.step(
        t,
        [s["actual"] for s in samples],
        where="post",
        color="tab:red",
        linestyle="--",
        label="actual workers",
    )
    bottom.set_ylabel("workers")
    bottom.set_xlabel("seconds since the spike")
    bottom.set_ylim(0, args.max_workers + 1)
    bottom.legend(loc="upper right")
    for ax in (top, bottom):
        ax.axvline(0, color="grey", linewidth=0.8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
