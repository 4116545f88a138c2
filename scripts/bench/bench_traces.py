"""The trace scenario: herder's autoscaling on real-shaped traffic, beside the rules of the
autoscalers people run or pay for, all driving the same herder workers.

    scripts/bench/run traces --svg-dir docs --markdown /tmp/traces.md     (about 20 minutes)
    scripts/bench/run traces --simulate                                   (the simulator, ~1 minute)

Six seeded arrival traces of 150 s each (bench_tracesim.py: a step, a spike on a quiet queue, a
daily curve, on-off bursts, a slow ramp, a mix of 20 ms and 2 s jobs), each job sleeping for a
lognormal time. For each trace, every policy gets its own private redis-server and its own
`herder run` (min 1, max 10 workers), all started together, and the same jobs enqueued at the
same moments (one thread per pair):

- herder's own autoscaler (`--min-workers 1 --max-workers 10`), and with `--max-wait` (the target);
- fixed at the minimum and at the maximum (`--workers N`);
- Judoscale-, HireFire- and KEDA-like rules, each with its documented time constants and with them
  scaled as the trace's time is compressed: an outside scaler (a thread here) reads the queue
  from Redis as those products do and calls `herder scale N` on a herder of fixed size, so only
  the policy differs.

Jobs sleep, so the runs share the 2 cores without taking turns on them; the report gives the
load average. The oracle (the fewest worker-seconds meeting the target, in hindsight) is computed
offline on the same trace. Per trace and policy: the seconds jobs waited beyond the target
(summed), the p95 and p99 wait (RQ's enqueued_at to started_at), worker-seconds (RQ's registered
workers sampled every 0.25 s, over the trace's 150 s) and scale events. `--svg-dir` writes a
chart per trace (workers and waiting jobs over time, one line per policy). Not a test: by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from redis import Redis
from rq import Queue
from rq.registry import StartedJobRegistry

import bench_tracesim as sim
from bench_base import BenchError, say
from bench_commands import herder_argv, herder_ctl_argv
from bench_procs import Processes, RedisServer, child_env, start_redis, take_charge
from bench_report import publish

SUMMARY = "autoscaling on six traffic traces: herder beside Judoscale-, HireFire- and KEDA-like rules"
JOB_SOURCE = "import time\n\n\ndef work(seconds):\n    time.sleep(seconds)\n"
QUEUE = "default"
SAMPLE = 0.25  # seconds between samples of each pair's workers and queue
# herder without a wait target keeps waits around a second: it is judged against the oracle of
# that service level (the fewest worker-seconds keeping every job within 1 s), not the 5 s one.
TIGHT = 1.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--traces", default=",".join(t.name for t in sim.make_traces(length=1.0)))
    p.add_argument("--target", type=float, default=5.0, help="the wait target, seconds")
    p.add_argument(
        "--tight",
        type=float,
        default=TIGHT,
        help="a second oracle's wait target, seconds: the service level herder keeps without a target",
    )
    p.add_argument("--max-workers", type=int, default=10)
    p.add_argument("--length", type=float, default=sim.LENGTH, help="seconds of arrivals per trace")
    p.add_argument("--seed", type=int, default=54)
    p.add_argument("--tail", type=float, default=30.0, help="seconds after the trace for its queue to drain")
    p.add_argument("--policies", default="", help="only these (comma-separated names); default: all")
    p.add_argument("--simulate", action="store_true", help="the simulator only (no Redis, no herder)")
    p.add_argument("--svg-dir", help="write a chart per trace here (traces-NAME.svg)")
    p.add_argument("--markdown", help="also write the report here")
    p.add_argument("--json", help="write every figure and timeline here")
    p.add_argument("--report-from", metavar="JSON", help="no runs: the report (and charts) of a saved --json")


@dataclass
class Run:
    name: str
    label: str
    figures: sim.Figures
    timeline: list[tuple[float, int, int]] = field(default_factory=list)
    tight: sim.Figures | None = None  # the same waits judged at the tight target (--tight)


def policies(b: sim.Bounds, trace: sim.Trace) -> list[sim.Rule]:
    """Every policy, as a rule for the simulator (herder's own stand in for herder's autoscaler)."""
    return [
        sim.Herder(b, None),
        sim.Herder(b, b.target),
        sim.Fixed(b.floor, "fixed-min"),
        sim.Fixed(b.ceiling, "fixed-max"),
        *sim.peers(b, trace.compress),
    ]


def run(args: argparse.Namespace) -> int:
    b = sim.Bounds(1, args.max_workers, args.target)
    wanted = {n.strip() for n in args.traces.split(",") if n.strip()}
    traces = [t for t in sim.make_traces(args.seed, args.length) if t.name in wanted]
    only = {n.strip() for n in args.policies.split(",") if n.strip()}
    results: dict[str, list[Run]] = {}
    started = time.monotonic()
    loads: list[float] = []
    if args.report_from:
        saved = json.loads(Path(args.report_from).read_text())
        meta = saved.pop("", {})
        results = {
            k: [
                Run(
                    r["name"],
                    r["label"],
                    sim.Figures(**r["figures"]),
                    [tuple(p) for p in r["timeline"]],
                    sim.Figures(**r["tight"]) if r.get("tight") else None,
                )
                for r in v
            ]
            for k, v in saved.items()
        }
        traces = [t for t in traces if t.name in results]
        for trace in traces:
            chart(trace, results[trace.name], args)
        publish(
            report(traces, results, b, args, meta.get("minutes", 0.0), meta.get("loads", [])), args.markdown
        )
        return 0
    if not args.simulate:
        take_charge()
    for trace in traces:
        rules = [r for r in policies(b, trace) if not only or r.name in only]
        busy = sum(j.seconds for j in trace.jobs)
        say(f"trace {trace.name}: {len(trace.jobs)} jobs, {busy:.0f} busy seconds")
        counts = sim.oracle(trace, b)
        out = sim.simulate(trace, sim.Schedule(counts), b)
        oracle_run = Run(
            out.name, out.label, sim.figures(out.waits, out.worker_seconds, out.scale_events, b.target)
        )
        oracle_run.timeline = out.timeline
        tight = sim.Bounds(b.floor, b.ceiling, args.tight)
        out = sim.simulate(
            trace,
            sim.Schedule(sim.oracle(trace, tight), "oracle-tight", f"oracle at {args.tight:g} s (hindsight)"),
            b,
        )
        tight_run = Run(
            out.name,
            out.label,
            sim.figures(out.waits, out.worker_seconds, out.scale_events, b.target),
            out.timeline,
        )
        if args.simulate:
            runs = []
            for rule in rules:
                o = sim.simulate(trace, rule, b)
                runs.append(
                    Run(
                        o.name,
                        o.label,
                        sim.figures(o.waits, o.worker_seconds, o.scale_events, b.target),
                        tight=sim.figures(o.waits, o.worker_seconds, o.scale_events, args.tight),
                    )
                )
                runs[-1].timeline = o.timeline
        else:
            tmp = Path(tempfile.mkdtemp(prefix=f"herder-traces-{trace.name}-"))
            try:
                runs = measure(trace, rules, b, args, tmp)
            except BenchError as exc:
                say(f"error: {exc}; logs kept in {tmp}")
                return 1
            loads.append(os.getloadavg()[0])
            shutil.rmtree(tmp, ignore_errors=True)
        results[trace.name] = [*runs, oracle_run, tight_run]
        for r in results[trace.name]:
            f = r.figures
            say(
                f"  {r.label:32s} over {f.over:8.1f} s  p95 {f.p95:5.1f}  p99 {f.p99:5.1f}  "
                f"worker-s {f.worker_seconds:6.0f}  events {f.events}"
            )
        chart(trace, results[trace.name], args)
    minutes = (time.monotonic() - started) / 60
    publish(report(traces, results, b, args, minutes, loads), args.markdown)
    if args.json:
        saved = {k: [asdict(r) for r in v] for k, v in results.items()}
        Path(args.json).write_text(json.dumps({"": {"minutes": minutes, "loads": loads}, **saved}, indent=1))
    return 0


def chart(trace: sim.Trace, runs: list[Run], args: argparse.Namespace) -> None:
    if args.svg_dir:
        path = Path(args.svg_dir) / f"traces-{trace.name}.svg"
        series = [(r.name, r.label, r.timeline) for r in runs]
        path.write_text(sim.svg_chart(f"{trace.name}: {trace.title}", series, trace.length))
        say(f"  drew {path}")


# ---------------------------------------------------------------- the real runs


@dataclass
class Pair:
    """One policy's redis-server and herder, and what was seen of them."""

    rule: sim.Rule
    state: Path
    server: RedisServer
    redis: Redis
    herder: object = None
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (t, workers, waiting)
    ids: list[str] = field(default_factory=list)
    scale_calls: int = 0
    log: Path | None = None


def herder_flags(rule: sim.Rule, b: sim.Bounds) -> list[str]:
    """How each policy's herder is started: herder's own autoscaler, or a fixed size that an
    outside scaler changes with `herder scale`."""
    if isinstance(rule, sim.Herder):
        flags = ["--min-workers", str(b.floor), "--max-workers", str(b.ceiling)]
        return flags + ([] if rule.cfg.max_wait is None else ["--max-wait", f"{rule.cfg.max_wait:g}"])
    if isinstance(rule, sim.Fixed):
        return ["--workers", str(rule.n)]
    return ["--workers", str(b.floor)]


def measure(
    trace: sim.Trace, rules: list[sim.Rule], b: sim.Bounds, args: argparse.Namespace, tmp: Path
) -> list[Run]:
    jobs_dir = tmp / "jobs"
    jobs_dir.mkdir()
    (jobs_dir / "trace_jobs.py").write_text(JOB_SOURCE)
    procs = Processes()
    pairs: list[Pair] = []
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        for rule in rules:
            server, conn = start_redis(tmp / rule.name, procs)
            pair = Pair(rule, tmp / rule.name / "state", server, conn)
            pair.log = tmp / rule.name / "herder.log"
            argv = herder_argv(
                server.url,
                path=jobs_dir,
                state_dir=pair.state,
                queue=QUEUE,
                scheduler=False,
                extra=herder_flags(rule, b),
            )
            pair.herder = procs.start(argv, pair.log)
            pairs.append(pair)
        deadline = time.monotonic() + 120
        for pair in pairs:  # every fleet at its starting size before the trace begins
            first = pair.rule.n if isinstance(pair.rule, sim.Fixed) else b.floor
            while workers(pair.redis) < first:
                if time.monotonic() > deadline:
                    raise BenchError(f"{pair.rule.name}: herder did not start its workers; see {pair.log}")
                time.sleep(0.1)
        t0 = time.monotonic() + 1.0
        end = t0 + trace.length + args.tail
        for pair in pairs:
            threads.append(threading.Thread(target=enqueue, args=(pair, trace, t0, stop), daemon=True))
            threads.append(threading.Thread(target=sample, args=(pair, t0, end, stop), daemon=True))
            if isinstance(pair.rule, sim.Judoscale | sim.HireFire | sim.Keda):
                threads.append(threading.Thread(target=scaler, args=(pair, t0, end, stop), daemon=True))
        for t in threads:
            t.start()
        while time.monotonic() < end:
            if time.monotonic() > t0 + trace.length and all(drained(p) for p in pairs):
                break
            time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        runs = [collect(pair, trace, b, args.tight) for pair in pairs]
    finally:
        stop.set()
        end_pairs(procs, pairs)
    return runs


def workers(r: Redis) -> int:
    """The workers registered with RQ: every policy's fleet is counted the same way."""
    return int(r.scard("rq:workers"))


def drained(pair: Pair) -> bool:
    q = Queue(QUEUE, connection=pair.redis)
    return q.count == 0 and StartedJobRegistry(QUEUE, connection=pair.redis).count == 0


def enqueue(pair: Pair, trace: sim.Trace, t0: float, stop: threading.Event) -> None:
    q = Queue(QUEUE, connection=pair.redis)
    for job in trace.jobs:
        delay = t0 + job.at - time.monotonic()
        if delay > 0 and stop.wait(delay):
            return
        pair.ids.append(q.enqueue("trace_jobs.work", job.seconds, result_ttl=3600, ttl=3600).id)


def sample(pair: Pair, t0: float, end: float, stop: threading.Event) -> None:
    q = Queue(QUEUE, connection=pair.redis)
    while not stop.is_set() and time.monotonic() < end:
        now = time.monotonic()
        with pair.redis.pipeline(transaction=False) as pipe:
            pipe.scard("rq:workers")
            pipe.llen(q.key)
            n, waiting = pipe.execute()
        pair.samples.append((now - t0, int(n), int(waiting)))
        stop.wait(max(0.0, SAMPLE - (time.monotonic() - now)))


def seen(pair: Pair, t0: float) -> sim.Seen:
    """What an outside scaler reads from Redis: the queue's length and its oldest job's age
    (Judoscale's and HireFire's latency, KEDA's list length), the jobs running, the workers."""
    q = Queue(QUEUE, connection=pair.redis)
    with pair.redis.pipeline(transaction=False) as pipe:
        pipe.llen(q.key)
        pipe.lindex(q.key, 0)
        pipe.scard("rq:workers")
        backlog, head, n = pipe.execute()
    age = 0.0
    if head:
        stamp = pair.redis.hget(f"rq:job:{head.decode()}", "enqueued_at")
        if stamp:
            age = max(0.0, time.time() - datetime.fromisoformat(stamp.decode()).timestamp())
    running = StartedJobRegistry(QUEUE, connection=pair.redis).count
    return sim.Seen(time.monotonic() - t0, int(backlog), int(running), age, int(n), 0, 0.0)


def scaler(pair: Pair, t0: float, end: float, stop: threading.Event) -> None:
    """The outside scaler: the peer's rule every interval, `herder scale N` when it changes."""
    rule, current = pair.rule, None
    next_look = t0 + rule.interval
    while not stop.is_set() and time.monotonic() < end:
        if stop.wait(max(0.0, next_look - time.monotonic())):
            return
        next_look += rule.interval
        want = rule.look(seen(pair, t0))
        if want is not None and want != (current if current is not None else 1):
            subprocess.run(
                herder_ctl_argv(pair.state, "scale", str(want)),
                capture_output=True,
                env=child_env(),
                check=False,
                timeout=30,
            )
            current = want
            pair.scale_calls += 1
            next_look = max(next_look, time.monotonic())


SCALE_LINE = re.compile(r"scale: \d+ -> \d+ workers")


def collect(pair: Pair, trace: sim.Trace, b: sim.Bounds, tight: float = TIGHT) -> Run:
    """The run's figures: each job's wait from RQ's timestamps (a job never started waits until
    the run ended), worker-seconds over the trace's length from the samples, scale events."""
    waits: list[float] = []
    with pair.redis.pipeline(transaction=False) as pipe:
        for job_id in pair.ids:
            pipe.hmget(f"rq:job:{job_id}", "enqueued_at", "started_at")
        stamps = pipe.execute()
    wall_end = time.time()  # the run has ended: a job never started waited until now
    for enqueued, started in stamps:
        if not enqueued:
            continue
        at = datetime.fromisoformat(enqueued.decode()).timestamp()
        start = datetime.fromisoformat(started.decode()).timestamp() if started else wall_end
        waits.append(max(0.0, start - at))
    missing = len(trace.jobs) - len(waits)
    if missing:
        say(f"  {pair.rule.name}: {missing} job(s) never enqueued or lost")
    ws, last = 0.0, None
    for t, n, _ in pair.samples:
        if last is not None and 0 <= last[0] < trace.length:
            ws += last[1] * (min(t, trace.length) - last[0])
        last = (t, n)
    if isinstance(pair.rule, sim.Herder):
        events = len(SCALE_LINE.findall(pair.log.read_text(errors="replace"))) if pair.log else 0
    else:
        events = pair.scale_calls
    timeline = [(t, n, q) for t, n, q in pair.samples if t >= 0 and abs(t - round(t)) < SAMPLE / 2]
    return Run(
        pair.rule.name,
        pair.rule.label,
        sim.figures(waits, ws, events, b.target),
        timeline,
        sim.figures(waits, ws, events, tight),
    )


def end_pairs(procs: Processes, pairs: list[Pair]) -> None:
    """Every herder stopped gracefully (all at once), then whatever is left, then the Redis servers."""
    for pair in pairs:
        if pair.herder is not None and pair.herder.poll() is None:
            pair.herder.terminate()
    for pair in pairs:
        if pair.herder is not None:
            try:
                pair.herder.wait(timeout=60)
            except subprocess.TimeoutExpired:
                say(f"  {pair.rule.name}: herder did not stop within 60 s")
    procs.kill_all(spare={p.server.pid for p in pairs})
    for pair in pairs:
        pair.server.stop()
    procs.kill_all(spare=set())


# ---------------------------------------------------------------- the report


def verdict(herder: sim.Figures, peer: sim.Figures, slack: float) -> str:
    """How herder (with the target) stands against a peer rule: it `beats` it (less waiting over
    the target at no more worker-seconds, or fewer worker-seconds at no more waiting, with
    `slack` seconds of waiting as noise), or the peer spent fewer worker-seconds by leaving
    jobs waiting past the target (`cheaper, late`), or they tie (as much waiting, and herder's
    worker-seconds within TIE of the peer's), or herder loses."""
    if sim.beats(herder, peer, slack):
        return "beats"
    if peer.over > herder.over + slack and peer.worker_seconds < herder.worker_seconds:
        return "cheaper, late"
    if abs(herder.over - peer.over) <= slack and herder.worker_seconds <= TIE * peer.worker_seconds:
        return "ties"
    return "loses"


TIE = 1.02  # worker-seconds within 2 %: a tie (two runs of one policy differ by about as much)


def report(
    traces: list[sim.Trace],
    results: dict[str, list[Run]],
    b: sim.Bounds,
    args: argparse.Namespace,
    minutes: float,
    loads: list[float],
) -> str:
    how = "simulated (bench_tracesim.py)" if args.simulate else "measured"
    lines = [
        "## Autoscaling on traces",
        "",
        f"Command: `scripts/bench/run traces{' --simulate' if args.simulate else ''}` "
        f"(seed {args.seed}, {args.length:g} s per trace, min {b.floor}, max {b.ceiling} workers, "
        f"wait target {b.target:g} s), {how}, {minutes:.1f} minutes"
        + (f", load average {min(loads):.1f} to {max(loads):.1f} after each trace" if loads else "")
        + ".",
        "",
    ]
    for trace in traces:
        runs = results.get(trace.name, [])
        if not runs:
            continue
        busy = sum(j.seconds for j in trace.jobs)
        scale = f"{trace.compress:g}x" if trace.compress < 100 else f"{trace.compress:.0f}x"
        lines += [
            f"### Trace {trace.name}: {trace.title}",
            "",
            f"{len(trace.jobs)} jobs, {busy:.0f} busy seconds; its {trace.length:g} s stand for "
            f"{trace.stands_for} (the scaled rules' time constants divided by {scale}).",
            "",
            "| policy | over target, s | late jobs | p95 wait, s | p99 wait, s | worker-s | scale events |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in runs:
            f = r.figures
            lines.append(
                f"| {r.label} | {f.over:.0f} | {f.late} | {f.p95:.1f} | {f.p99:.1f} | "
                f"{f.worker_seconds:.0f} | {f.events} |"
            )
        lines.append("")
    lines += verdict_table(traces, results, b)
    lines += ["", *default_table(traces, results, b, getattr(args, "tight", TIGHT))]
    return "\n".join(lines) + "\n"


def default_table(
    traces: list[sim.Trace], results: dict[str, list[Run]], b: sim.Bounds, tight: float
) -> list[str]:
    """herder without a target against the oracle of its own service level (every job within
    `tight` seconds) and against the oracle of the wait target, per trace."""
    peers = ["judoscale", "judoscale-scaled", "hirefire", "hirefire-scaled", "keda", "keda-scaled"]
    labels: dict[str, str] = {}
    rows, verdicts = [], []
    for trace in traces:
        by = {r.name: r for r in results.get(trace.name, [])}
        if "herder" not in by or "oracle-tight" not in by:
            continue
        h, t = by["herder"].figures, by["oracle-tight"].figures
        ht = by["herder"].tight
        if ht is not None:
            slack = 0.01 * len(trace.jobs)
            cells = []
            for p in peers:
                peer = by.get(p)
                if peer is not None and peer.tight is not None:
                    labels[p] = peer.label
                    cells.append(verdict(ht, peer.tight, slack))
                else:
                    cells.append("")
            if any(cells):  # (a run of some policies only may have no rule to judge)
                verdicts.append(f"| {trace.name} | {' | '.join(cells)} |")
        o = by.get("oracle")
        wide = f"{h.worker_seconds / o.figures.worker_seconds:.2f}x" if o and o.figures.worker_seconds else ""
        ratio = f"{h.worker_seconds / t.worker_seconds:.2f}x" if t.worker_seconds else ""
        rows.append(
            f"| {trace.name} | {h.worker_seconds:.0f} | {h.p99:.1f} | {t.worker_seconds:.0f} | {t.p99:.1f} "
            f"| {ratio} | {wide} |"
        )
    return [
        f"### herder without a target against the oracle at {tight:g} s",
        "",
        "herder's default keeps waits around a second, so it is held to the oracle that keeps",
        f"every job within {tight:g} s (where no fleet within the bounds can, as the maximum would);",
        f"the last column is against the {b.target:g} s oracle, the service level it does not aim at.",
        "",
        f"| trace | herder worker-s | herder p99 wait, s | oracle at {tight:g} s worker-s | its p99, s "
        f"| herder / it | herder / {b.target:g} s oracle |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        *(
            [
                "",
                f"The same against each rule, judged at {tight:g} s (beats, ties, cheaper, late: as above,",
                f"with the waiting over {tight:g} s in place of the waiting over the target):",
                "",
                f"| trace | {' | '.join(labels.get(p, p) for p in peers)} |",
                "|---|" + "---|" * len(peers),
                *verdicts,
            ]
            if verdicts
            else []
        ),
    ]


def verdict_table(traces: list[sim.Trace], results: dict[str, list[Run]], b: sim.Bounds) -> list[str]:
    """herder with the target against each peer rule and the oracle, per trace."""
    peers = ["judoscale", "judoscale-scaled", "hirefire", "hirefire-scaled", "keda", "keda-scaled"]
    labels: dict[str, str] = {}
    rows = []
    for trace in traces:
        by = {r.name: r for r in results.get(trace.name, [])}
        if "herder-wait" not in by:
            continue
        h = by["herder-wait"].figures
        slack = 0.01 * len(trace.jobs)  # 10 ms a job: the noise of a real run
        cells = []
        for p in peers:
            if p in by:
                labels[p] = by[p].label
                cells.append(verdict(h, by[p].figures, slack))
            else:
                cells.append("")
        o = by.get("oracle")
        ratio = (
            f"{h.worker_seconds / o.figures.worker_seconds:.2f}x" if o and o.figures.worker_seconds else ""
        )
        rows.append(f"| {trace.name} | {' | '.join(cells)} | {ratio} |")
    head = " | ".join(labels.get(p, p) for p in peers)
    return [
        f"### herder --max-wait {b.target:g} against each rule",
        "",
        "beats: less waiting over the target at no more worker-seconds, or fewer worker-seconds at",
        "no more waiting (10 ms a job of waiting counted as noise); ties: as much waiting, and",
        "worker-seconds within 2 %; cheaper, late: the rule spent fewer worker-seconds by leaving",
        "jobs waiting past the target; last column: herder's worker-seconds over the oracle's.",
        "",
        f"| trace | {head} | / oracle |",
        "|---|" + "---|" * len(peers) + "---:|",
        *rows,
    ]
