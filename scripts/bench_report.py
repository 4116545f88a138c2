"""The report: one markdown document (machine, throughput, crash to replacement, targets,
problems and noise), printed and optionally written to a file."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from bench_base import median, p90, say
from bench_contenders import CRASH_CONTENDERS, HERDER, RQ_DEFAULT, RQ_SIMPLE, THROUGHPUT_CONTENDERS


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


def publish(report: str, markdown: str | None) -> None:
    """Print the report, and write it to `markdown` if given."""
    print(report)
    if markdown:
        Path(markdown).write_text(report)
        say(f"report written to {markdown}")
