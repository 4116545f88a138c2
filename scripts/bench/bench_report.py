"""The report: one markdown document (machine, contenders, throughput with the floor and each
contender's share of it, crash to replacement with and without CPU load, idle pools, scaling,
ratios, the targets herder is held to, problems and noise), printed and optionally written
to a file; and the pieces the scenarios' reports share."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from pathlib import Path

from bench_base import Findings, median, p90, say
from bench_contenders import BY_KEY, PEERS, RQ_DEFAULT, RQ_SIMPLE, SUPERVISORD, Contender
from bench_floor import FLOOR_KEY, FLOOR_LABEL

# The targets herder is held to, by what they measure.
# Throughput: x rq worker-pool with SimpleWorker (each a row), and share of the floor's.
TARGET_X_SIMPLE = (1.0, 2.5, 3.0)
TARGET_X_SUPERVISORD = 1.0
TARGET_FLOOR_SHARES = (0.25, 0.45)
# Crash to replacement: kill -> listed by RQ, median, in seconds, by crash test variant.
TARGET_LISTED = {"crash": (0.030,), "busy": (0.030,), "noisy": (0.050,), "load": (0.050, 0.030)}
# Launch: -> first job done no slower than rq's pool (each class), and within this x of it;
# -> all workers ready within this x as well.
TARGET_LAUNCH_X = 1.5
# Stop and memory.
TARGET_WORKER_STOP = 0.5  # graceful stop of one idle worker, seconds
TARGET_USS_MB = 23 / 2  # USS per idle worker: half the 23 MB it once was
TARGET_POOL_USS_X = 1.5  # an idle pool's whole USS within this x rq's pool's
# Scaling: the master's CPU per job at the second size within this x of the first; its threads
# at the largest size at most 2 + a fixed few.
TARGET_CPU_SIZES = (4, 64)
TARGET_CPU_GROWTH = 1.5
# A big fleet: the master's CPU per job at each size within this x its figure at 4; all
# workers registered at the largest size within this x the time at 64 (linear: 4x for 4x
# the workers); the master idle under this share of a core at the largest size.
TARGET_CPU_GROWTH_BIG = 1.3
TARGET_READY_GROWTH = 4.5
TARGET_IDLE_CPU = 0.01
TARGET_THREADS = 8


def fmt_ratio(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def fmt_ms(x: float) -> str:
    return "n/a" if math.isnan(x) else (f"{x * 1000:.1f} ms" if x < 10 else f"{x:.2f} s")


def fmt_mb(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.1f} MB"


def ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


def yn(value: float, ok: bool) -> str:
    return "n/a" if math.isnan(value) else ("yes" if ok else "**no**")


def fmt_share(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x * 100:.0f}%"


class Medians:
    """The headline figure of each contender for each measurement (NaN when not measured)."""

    def __init__(self, results: dict) -> None:
        self.r = results

    def _thr(self, key: str, field: str) -> float:
        return median([r[field] for r in self.r["throughput"].get(key, [])])

    def jobs_per_s(self, key: str) -> float:
        return self._thr(key, "jobs_per_s")

    def first_done(self, key: str) -> float:
        return self._thr(key, "first_done_after")

    def floor_share(self, key: str) -> float:
        """Median jobs/s as a share of the floor's median jobs/s."""
        return ratio(self.jobs_per_s(key), self.jobs_per_s(FLOOR_KEY))

    def scaling(self, key: str, size: int, field: str) -> float:
        r = self.r["scaling"].get(key, {}).get(size)
        return math.nan if r is None else r[field]

    def scaling_rounds(self, key: str, small: int, big: int, field: str) -> list[tuple[float, float]]:
        """(figure at `small`, figure at `big`) for each round that ran both sizes."""
        by_size = self.r["scaling"].get(key, {})
        runs = {
            size: {r["round"]: r[field] for r in by_size[size]["runs"]}
            for size in (small, big)
            if size in by_size
        }
        if len(runs) < 2:
            return []
        return [(runs[small][t], runs[big][t]) for t in sorted(runs[small].keys() & runs[big].keys())]

    def crash(self, key: str, field: str, mode: str = "crash") -> float:
        """A crash variant's median: mode "crash" (idle), "busy", "noisy" or "load"."""
        r = self.r.get(mode, {}).get(key)
        return median(r[field]) if r and r.get(field) else math.nan

    def idle(self, key: str, field: str) -> float:
        runs = self.r["idle"].get(key, [])
        if field == "stop":
            return median([r["stop"].seconds for r in runs])
        if field == "ready":
            return median([r["ready"] for r in runs])
        return median([r["memory"][field] for r in runs])

    def worker_stop(self, key: str) -> tuple[float, str]:
        """herder's graceful stop of one idle worker, from its log: `herder scale N-1` in the
        crash test if it ran, else each worker's during the idle pools' stops."""
        one = (self.r["crash"].get(key) or {}).get("one_stop") or []
        if one:
            return median(one), "one worker, `herder scale N-1` (its log)"
        each = [s for r in self.r["idle"].get(key, []) for s in r["worker_stops"]]
        if each:
            return median(each), "each worker during a pool stop (its log)"
        return self.idle(key, "stop"), "the whole pool (SIGTERM to exit)"


def render(
    args: argparse.Namespace,
    command: str,
    facts: dict,
    contenders: list[Contender],
    commands: dict[str, str],
    results: dict,
    findings: Findings,
) -> str:
    m = Medians(results)
    out = ["# herder benchmark", ""]
    out += [f"Command: `{command}`", ""]
    out += [f"Run at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", ""]
    out += ["| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in facts.items()]
    out += [
        "",
        "| contender | command (URL: the private redis-server; TMP: the bench's temp dir) |",
        "|---|---|",
    ]
    out += [f"| {c.label} | `{commands[c.key]}` |" for c in contenders]
    if FLOOR_KEY in results["throughput"] and FLOOR_KEY in commands:
        out.append(
            f"| {FLOOR_LABEL} | `{commands[FLOOR_KEY]}` for I = 0 to {args.workers - 1}, started together |"
        )
    out.append("")
    out += throughput_section(args, contenders, results["throughput"])
    for mode in ("crash", "busy", "noisy", "load"):
        out += crash_section(args, contenders, results.get(mode, {}), mode)
    out += idle_section(args, contenders, results, m)
    out += scaling_section(args, results["scaling"])
    out += ratio_section(contenders, m)
    out += target_section(args, contenders, m)
    out += ["## Problems seen", ""]
    out += [f"- {p}" for p in findings.problems] or ["None."]
    out += ["", "## Noise warnings", ""]
    out += [f"- {w}" for w in findings.warnings] or [
        "None: other processes stayed under --max-other-load in every run."
    ]
    out.append("")
    return "\n".join(out)


def throughput_section(args: argparse.Namespace, contenders: list[Contender], thr: dict) -> list[str]:
    if not thr:
        return []
    floor = thr.get(FLOOR_KEY)
    floor_jps = median([r["jobs_per_s"] for r in floor]) if floor else math.nan
    out = [
        f"## Throughput: {args.jobs} no-op jobs, {args.workers} workers, median of {args.rounds} rounds",
        "",
        "jobs/s = jobs / (last job's `ended_at` - first job's `started_at`); "
        "wall = pool launch to the last `ended_at`; launch -> first job done = pool launch to the first "
        "`ended_at` (the jobs are queued before the launch); steady = jobs/s between the 10% and the 90% "
        "`ended_at`; CPU per job = CPU time used between 10% and 90% of jobs done (psutil), "
        "split into the workers (with rq's fork-per-job work horses and scheduler, herder's template and "
        "scheduler) and the supervising processes (herder's watchdog + master; rq's pool process; "
        "supervisord). All medians over the rounds.",
        "",
        f"The floor (last row) is the least a reliable Redis queue does per job, in {args.workers} plain "
        "processes and nothing else: `LMOVE` the job id from the queue to the process's own processing "
        "list (`BLMOVE` when the queue is empty), a no-op, then one `MULTI/EXEC` of `SET` result key "
        "`EX 500` (RQ's result TTL) and `LREM` from the processing list. The same number of jobs, queued "
        "as plain ids before the processes start; jobs/s from the first job taken to the last job done "
        "(timestamps the processes record), so start-up does not count either. share of the floor = a "
        "contender's jobs/s / the floor's jobs/s (medians)."
        if floor is not None
        else "The floor was not run (--skip-floor): no share of the floor.",
        "",
        "| contender | jobs/s (median) | share of the floor | jobs/s per round | wall s (median) "
        "| launch -> first job done | steady jobs/s, 10-90% | CPU ms/job: workers + supervisor "
        "| noise, cores: other processes + steal (max) |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    rows = [(c.key, c.label) for c in contenders]
    if floor is not None:
        rows.append((FLOOR_KEY, FLOOR_LABEL))
    for key, label in rows:
        rs = thr.get(key, [])
        if not rs:
            out.append(f"| {label} | failed | | | | | | | |")
            continue
        jps = median([r["jobs_per_s"] for r in rs])
        per_round = ", ".join(f"{r['jobs_per_s']:.0f}" for r in rs)
        wall = median([r["wall"] for r in rs])
        first = median([r["first_done_after"] for r in rs])
        load = max(r["other_load"] for r in rs)
        steal = max(r["steal"] for r in rs)
        steady = median([r["steady_jobs_per_s"] for r in rs])
        cpu_w = median([r["cpu_workers"] for r in rs]) * 1000
        cpu_s = median([r["cpu_supervisor"] for r in rs]) * 1000
        cpu = f"{cpu_w:.2f} + none" if key == FLOOR_KEY else f"{cpu_w:.2f} + {cpu_s:.2f}"
        out.append(
            f"| {label} | {jps:.0f} | {fmt_share(ratio(jps, floor_jps))} | {per_round} | {wall:.2f} "
            f"| {fmt_ms(first)} | {steady:.0f} | {cpu} | {load:.2f} + {steal:.2f} |"
        )
    out.append("")
    return out


CRASH_TITLES = {
    "crash": "at idle (the pool has run nothing yet)",
    "busy": "after a busy spell (the pool just drained {busy_jobs} no-op jobs, and idles)",
    "noisy": "under noisy full load (every worker runs jobs that print to stdout and stderr; a backlog "
    "always waits)",
    "load": "under full CPU load (one busy loop per core, at the same priority as everything else; idle "
    "workers)",
}


def crash_section(args: argparse.Namespace, contenders: list[Contender], crash: dict, mode: str) -> list[str]:
    if not crash:
        return []
    kills = args.load_kills if mode == "load" else args.kills
    title = CRASH_TITLES[mode].format(busy_jobs=args.busy_jobs)
    out = [f"## Crash to replacement {title}: SIGKILL one worker of {args.workers}, {kills} kills", ""]
    if mode == "load":
        busy = [r["busy"] for r in crash.values() if not math.isnan(r["busy"])]
        out += [
            "Machine CPU use during the kills: " + (f"{min(busy) * 100:.0f}% at least." if busy else "n/a."),
            "",
        ]
    out += [
        "listed = from just before the `kill -9` until RQ lists the replacement (the `sadd` to "
        "`rq:workers`, the set `rq.Worker.all()` reads, as Redis's keyspace notification tells the bench: "
        "nothing is polled meanwhile)"
        + (
            f"; first job = until the replacement's worker hash shows it took a job (polled every "
            f"{args.poll_interval * 1000:g} ms)"
            if mode == "noisy"
            else ""
        )
        + ". Median and p90 (nearest rank).",
        "",
        "| contender | listed median | listed p90 | first job median | first job p90 "
        "| noise, cores: other processes + steal |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c in contenders:
        r = crash.get(c.key)
        if not r:
            out.append(
                f"| {c.label} | {'not run' if mode == 'noisy' and c == RQ_DEFAULT else 'failed'} | | | | |"
            )
            continue
        noise = (
            f"{r['other_load']:.2f} + {r['steal']:.2f}" if mode in ("crash", "busy") else "(the load is ours)"
        )
        jobs = [x for x in r["first_job"] if not math.isnan(x)]
        out.append(
            f"| {c.label} | {fmt_ms(median(r['listed']))} | {fmt_ms(p90(r['listed']))} "
            f"| {fmt_ms(median(jobs))} | {fmt_ms(p90(jobs))} | {noise} |"
        )
    for c in contenders:
        r = crash.get(c.key)
        if c.is_herder and r and r.get("log_spawn"):
            out.append(
                f"| {c.label}, its own log (1 ms steps): `spawned` median, p90, then `ready` median, p90 "
                f"| {fmt_ms(median(r['log_spawn']))} | {fmt_ms(p90(r['log_spawn']))} "
                f"| {fmt_ms(median(r['log_ready']))} | {fmt_ms(p90(r['log_ready']))} | |"
            )
    if mode == "noisy" and RQ_DEFAULT in contenders:
        out += ["", f"{RQ_DEFAULT.label} is not run here: each of its busy workers has a work horse."]
    out.append("")
    return out


def idle_section(
    args: argparse.Namespace, contenders: list[Contender], results: dict, m: Medians
) -> list[str]:
    idle = results["idle"]
    if not idle and not results["throughput"]:
        return []
    out = [
        f"## Start-up, memory and graceful stop: idle pools of {args.workers}, "
        f"median of {args.idle_runs} runs",
        "",
        "launch -> first job done: from the throughput rounds (jobs queued before the launch). "
        "launch -> all registered: an empty queue, until every worker is a live child of the master and in "
        "`rq.Worker.all()`. Memory after the pool idled "
        f"{args.idle_settle:g} s: USS (memory only that process holds), PSS (its share of the pages it "
        "maps) and RSS of each worker (median over the workers and runs); the supervising process "
        "(herder's master, rq's pool process, supervisord); the other processes of the pool (herder: "
        "watchdog, fork server template, scheduler; rq: the scheduler process under one worker); the "
        "whole pool's USS and PSS summed (a forked worker's pages shared with its parent count in no "
        "one's USS: the PSS sum is the fair total). stop: SIGTERM to the pool's top process until it exits.",
        "",
        "| contender | launch -> first job done | launch -> all registered | stop (idle pool) "
        "| worker USS | worker PSS | worker RSS | supervisor RSS (USS) | other processes: count, USS "
        "| whole pool USS | whole pool PSS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in contenders:
        runs = idle.get(c.key, [])
        others = median([r["memory"]["others"] for r in runs])
        out.append(
            f"| {c.label} | {fmt_ms(m.first_done(c.key))} | {fmt_ms(m.idle(c.key, 'ready'))} "
            f"| {fmt_ms(m.idle(c.key, 'stop'))} | {fmt_mb(m.idle(c.key, 'worker_uss'))} "
            f"| {fmt_mb(m.idle(c.key, 'worker_pss'))} | {fmt_mb(m.idle(c.key, 'worker_rss'))} "
            f"| {fmt_mb(m.idle(c.key, 'sup_rss'))} ({fmt_mb(m.idle(c.key, 'sup_uss'))}) "
            f"| {'n/a' if math.isnan(others) else f'{others:.0f}'}, {fmt_mb(m.idle(c.key, 'others_uss'))} "
            f"| {fmt_mb(m.idle(c.key, 'tree_uss'))} | {fmt_mb(m.idle(c.key, 'tree_pss'))} |"
        )
    out.append("")
    for c in contenders:
        if c.is_herder:
            secs, how = m.worker_stop(c.key)
            each = [s for r in idle.get(c.key, []) for s in r["worker_stops"]]
            line = f"{c.label}: graceful stop of one idle worker, {how}: {fmt_ms(secs)}"
            if each and "scale" in how:
                line += f"; each worker during the idle pools' stops: median {fmt_ms(median(each))}"
                line += f", max {fmt_ms(max(each))}"
            out += [line + ".", ""]
    return out


def scaling_section(args: argparse.Namespace, scaling: dict) -> list[str]:
    if not scaling:
        return []
    peers_max = args.scale_peers_max
    skipped = [
        BY_KEY[k].label
        for k in scaling
        if not BY_KEY[k].is_herder and any(0 < peers_max < size for size in args.scale_sizes)
    ]
    who = ", ".join(BY_KEY[k].label for k in scaling)
    ran = f"Ran: {who}, at every size."
    if skipped:
        ran = (
            f"Ran: {who}; " + ", ".join(skipped) + f" only at sizes up to {peers_max} (--scale-peers-max: "
            "hundreds of peer workers take minutes to start on a small machine), herder at every size."
        )
    out = [
        "## Scaling: pool sizes " + ", ".join(str(s) for s in args.scale_sizes),
        "",
        f"Per run: max({args.scale_jobs_min}, {args.scale_jobs_per_worker} x N) no-op jobs, released into "
        "the queue at once when all N workers are registered and the pool has idled "
        f"{args.idle_settle:g} s. jobs/s as in the throughput table. Supervisor: herder's master, rq's pool "
        "process, supervisord (that process alone, not its children): its CPU time (user + system) from "
        "the release to the last job done, per 1,000 jobs; its CPU while the pool idles (a share of one "
        "core, over 3 s before the release); its RSS when idle; its threads when idle and "
        "at most during the run. "
        + (
            f"herder: {args.scale_runs} runs of each size in rounds (every size once a round); its row is "
            "the median of each figure (threads: the most), the peers' rows one run. "
            if args.scale_runs > 1
            else "One run per size. "
        )
        + "herder gets `--workers-limit N` above 16 workers. "
        + ran,
        "",
        "| contender | workers | jobs | jobs/s | supervisor CPU per 1,000 jobs | supervisor CPU idle "
        "| supervisor RSS | supervisor threads: idle, peak | worker USS / PSS (median) "
        "| launch -> all registered | stop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, by_size in scaling.items():
        c = BY_KEY[key]
        for size in args.scale_sizes:
            r = by_size.get(size)
            if not r:
                why = "skipped" if not c.is_herder and 0 < peers_max < size else "failed"
                out.append(f"| {c.label} | {size} | {why} | | | | | | | | |")
                continue
            mem = r["memory"]
            out.append(
                f"| {c.label} | {size} | {r['jobs']} | {r['jobs_per_s']:.0f} "
                f"| {r['sup_cpu_per_1000'] * 1000:.0f} ms | {fmt_share(r.get('sup_idle_cpu', math.nan))} "
                f"| {fmt_mb(mem['sup_rss'])} "
                f"| {r['threads_idle']}, {r['threads_peak']} "
                f"| {fmt_mb(mem['worker_uss'])} / {fmt_mb(mem['worker_pss'])} "
                f"| {fmt_ms(r['ready'])} | {fmt_ms(r['stop'].seconds)} |"
            )
    out.append("")
    return out


def ratio_section(contenders: list[Contender], m: Medians) -> list[str]:
    herders = [c for c in contenders if c.is_herder]
    peers = [c for c in contenders if c in PEERS]
    if not herders or not peers:
        return []
    out = [
        "## Ratios: herder / each peer (medians)",
        "",
        "jobs/s: higher is better for herder; the others (time, memory): lower is better for herder.",
        "",
        "| ratio | jobs/s | crash -> listed | launch -> first job done | stop (idle pool) | worker USS |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for h in herders:
        for p in peers:
            out.append(
                f"| {h.label} / {p.label} "
                f"| {fmt_ratio(ratio(m.jobs_per_s(h.key), m.jobs_per_s(p.key)))} "
                f"| {fmt_ratio(ratio(m.crash(h.key, 'listed'), m.crash(p.key, 'listed')))} "
                f"| {fmt_ratio(ratio(m.first_done(h.key), m.first_done(p.key)))} "
                f"| {fmt_ratio(ratio(m.idle(h.key, 'stop'), m.idle(p.key, 'stop')))} "
                f"| {fmt_ratio(ratio(m.idle(h.key, 'worker_uss'), m.idle(p.key, 'worker_uss')))} |"
            )
    out.append("")
    return out


CRASH_WHEN = {
    "crash": "at idle",
    "busy": "after a busy spell",
    "noisy": "under noisy full load",
    "load": "under full CPU load",
}


def target_section(args: argparse.Namespace, contenders: list[Contender], m: Medians) -> list[str]:
    """The targets, a table for each thing measured: a row per target, a column pair (measured,
    met) per herder variant."""
    herders = [c for c in contenders if c.is_herder]
    if not herders:
        return []
    head = ["| target | " + " | ".join(f"{h.label}: measured | met" for h in herders) + " |"]
    head.append("|---|" + "---|---|" * len(herders))
    Cell = Callable[[Contender], tuple[str, str]]  # noqa: N806  (a herder -> (measured, met))
    out: list[str] = []

    def table(title: str, note: str, rows: list[tuple[str, Cell]]) -> None:
        out.extend([f"## Targets: {title}", ""])
        if note:
            out.extend([note, ""])
        out.extend(head)
        out.extend(
            f"| {name} | " + " | ".join(" | ".join(cell(h)) for h in herders) + " |" for name, cell in rows
        )
        out.append("")

    def x_jobs_per_s(peer: Contender, times: float) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            r = ratio(m.jobs_per_s(h.key), m.jobs_per_s(peer.key))
            return fmt_ratio(r), yn(r, r >= times)

        return cell

    def share(least: float) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            x = m.floor_share(h.key)
            return fmt_share(x), yn(x, x >= least)

        return cell

    def listed(mode: str, limit: float) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            x = m.crash(h.key, "listed", mode)
            return fmt_ms(x), yn(x, x < limit)

        return cell

    def no_slower(peer: Contender) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            a, b = m.first_done(h.key), m.first_done(peer.key)
            return f"{fmt_ms(a)} vs {fmt_ms(b)}", yn(ratio(a, b), a <= b)

        return cell

    def within(figure: Callable[[str], float], peer: Contender, times: float) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            r = ratio(figure(h.key), figure(peer.key))
            return fmt_ratio(r), yn(r, r <= times)

        return cell

    def worker_stop(h: Contender) -> tuple[str, str]:
        x = m.worker_stop(h.key)[0]
        return fmt_ms(x), yn(x, x < TARGET_WORKER_STOP)

    def worker_uss(h: Contender) -> tuple[str, str]:
        x = m.idle(h.key, "worker_uss")
        return fmt_mb(x), yn(x, x <= TARGET_USS_MB)

    small, big = TARGET_CPU_SIZES
    largest = max(args.scale_sizes, default=0)

    def growth(
        key: str, a_size: int, b_size: int, field: str, show: Callable[[float], str]
    ) -> tuple[str, float]:
        """Each round's figure at b_size over its figure at a_size, run back to back (the same
        minutes of a shared machine), and their median: what the target is judged on."""
        rounds = m.scaling_rounds(key, a_size, b_size, field)
        ratios = [ratio(b, a) for a, b in rounds]
        if not ratios:
            return "", math.nan
        r = median(ratios)
        if len(rounds) == 1:
            ((a, b),) = rounds
            return f"{show(b)} vs {show(a)}: {fmt_ratio(r)}", r
        each = ", ".join(f"{show(b)} vs {show(a)}" for a, b in rounds)
        return f"{fmt_ratio(r)}, the median of {len(rounds)} rounds: " + each, r

    def cpu_growth(h: Contender) -> tuple[str, str]:
        shown, r = growth(h.key, small, big, "sup_cpu_per_1000", lambda x: f"{x * 1000:.0f} ms")
        return ("n/a", "n/a") if math.isnan(r) else (shown, yn(r, r <= TARGET_CPU_GROWTH))

    def cpu_growth_at(size: int) -> Cell:
        def cell(h: Contender) -> tuple[str, str]:
            shown, r = growth(h.key, small, size, "sup_cpu_per_1000", lambda x: f"{x * 1000:.0f} ms")
            return ("n/a", "n/a") if math.isnan(r) else (shown, yn(r, r <= TARGET_CPU_GROWTH_BIG))

        return cell

    def ready_growth(h: Contender) -> tuple[str, str]:
        if largest <= big:
            return "n/a", "n/a"
        shown, r = growth(h.key, big, largest, "ready", fmt_ms)
        return ("n/a", "n/a") if math.isnan(r) else (shown, yn(r, r <= TARGET_READY_GROWTH))

    def idle_cpu(h: Contender) -> tuple[str, str]:
        x = m.scaling(h.key, largest, "sup_idle_cpu") if largest else math.nan
        if math.isnan(x):
            return "n/a", "n/a"
        runs = m.r["scaling"][h.key][largest]["runs"]
        each = f" (median of {len(runs)}: " + ", ".join(f"{r['sup_idle_cpu'] * 100:.1f}%" for r in runs) + ")"
        return f"{x * 100:.1f}% at {largest} workers" + (each if len(runs) > 1 else ""), yn(
            x, x < TARGET_IDLE_CPU
        )

    def threads(h: Contender) -> tuple[str, str]:
        peak, idle = m.scaling(h.key, largest, "threads_peak"), m.scaling(h.key, largest, "threads_idle")
        if math.isnan(peak):
            return "n/a", "n/a"
        return f"{peak:.0f} at most ({idle:.0f} idle) at {largest} workers", yn(peak, peak <= TARGET_THREADS)

    table(
        "throughput",
        "The floor is the last row of the throughput table.",
        [
            *((f"throughput at least {x:g}x rq worker-pool SimpleWorker", x_jobs_per_s(RQ_SIMPLE, x))
              for x in TARGET_X_SIMPLE),
            (f"throughput at least {TARGET_X_SUPERVISORD:g}x supervisord + rq worker (SimpleWorker)",
             x_jobs_per_s(SUPERVISORD, TARGET_X_SUPERVISORD)),
            *((f"throughput at least {least:.0%} of the floor", share(least))
              for least in TARGET_FLOOR_SHARES),
        ],
    )  # fmt: skip
    table(
        "crash to replacement",
        "",
        [
            (
                f"kill -> listed by RQ {CRASH_WHEN[mode]}, median, under {limit * 1000:.0f} ms",
                listed(mode, limit),
            )
            for mode, limits in TARGET_LISTED.items()
            for limit in limits
        ],
    )
    launch: list[tuple[str, Cell]] = []
    for peer in (RQ_DEFAULT, RQ_SIMPLE):
        launch += [
            (f"launch -> first job done no slower than {peer.label}", no_slower(peer)),
            (f"launch -> first job done within {TARGET_LAUNCH_X:g}x {peer.label}",
             within(m.first_done, peer, TARGET_LAUNCH_X)),
            (f"launch -> all workers ready within {TARGET_LAUNCH_X:g}x {peer.label}",
             within(lambda key: m.idle(key, "ready"), peer, TARGET_LAUNCH_X)),
        ]  # fmt: skip
    table("launch", "Launch -> all workers ready: the idle pools' table.", launch)
    table(
        "stop and memory",
        "",
        [
            (f"graceful stop of one idle worker under {TARGET_WORKER_STOP:g} s", worker_stop),
            (f"USS per idle worker at most {TARGET_USS_MB:g} MB (half of 23 MB)", worker_uss),
            *((f"idle pool's whole USS within {TARGET_POOL_USS_X:g}x {peer.label}",
               within(lambda key: m.idle(key, "tree_uss"), peer, TARGET_POOL_USS_X))
              for peer in (RQ_SIMPLE, RQ_DEFAULT)),
        ],
    )  # fmt: skip
    table(
        "scaling",
        f"The master's CPU is the scaling table's supervisor CPU per 1,000 jobs at {small} and at {big} "
        f"workers (n/a where a size did not run); its threads, the most seen during the run at the "
        f"largest size ({largest or 'none'}).",
        [
            (f"master CPU per job at {big} workers within {TARGET_CPU_GROWTH:g}x of its figure at {small}",
             cpu_growth),
            (f"master threads at the largest scaling size at most {TARGET_THREADS} "
             f"(2 + {TARGET_THREADS - 2})", threads),
            *((f"master CPU per job at {size} workers within {TARGET_CPU_GROWTH_BIG:g}x of its figure "
               f"at {small}", cpu_growth_at(size)) for size in sorted({big, largest}) if size > small),
            (f"all workers registered at the largest size within {TARGET_READY_GROWTH:g}x the time at {big}",
             ready_growth),
            (f"master idle under {TARGET_IDLE_CPU:.0%} of a core at the largest size", idle_cpu),
        ],
    )  # fmt: skip
    return out


def key_table(labels: dict[str, str], results: dict[str, dict], rows: list[str]) -> list[str]:
    """A markdown table of a scenario's runs: a column per run (its label), a row per figure."""
    out = ["| | " + " | ".join(labels.values()) + " |", "|---|" + "---:|" * len(labels)]
    for row in rows:
        out.append(f"| {row} | " + " | ".join(str(results[k][row]) for k in labels) + " |")
    return out


def publish(report: str, markdown: str | None) -> None:
    """Print the report, and write it to `markdown` if given."""
    print(report)
    if markdown:
        Path(markdown).write_text(report)
        say(f"report written to {markdown}")
