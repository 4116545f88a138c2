"""Advice from what herder sees: per pool, what to change and the figures behind it. Pure: it
reads an `Evidence` (plain data the loop recorded, views/evidence.py) and says, each with the
jobs and minutes it rests on, and nothing on too little data:

- threads or processes: jobs mostly off the CPU (their CPU seconds against their busy seconds,
  from `done`, protocol version 10) would be served by threads at a share of the memory; CPU-bound
  jobs in threads wait for one another (the GIL) and want processes;
- recycling: RSS growing per job (a slope over jobs within each worker, clear of its noise) gets
  a max_jobs that keeps workers under a stated size; else "no leak seen over N jobs";
- bounds: a pool held at its max while jobs waited over the wait target (raise max), a min that
  sat idle (lower it), a scale-down that came back up soon after, again and again (a longer
  scale_down_delay).

It never changes a setting: a person reads it (docs/advice.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

MIB = 1024 * 1024

# How much data a piece of advice needs before it is said at all.
MIN_JOBS = 30  # jobs, for threads and recycling
MIN_SECONDS = 30.0  # of observation, for every piece
IDLE_SECONDS = 600.0  # a min judged idle over at least this long
FLAP_SECONDS = 300.0  # flapping judged over at least this long

# Threads or processes.
IO_SHARE = 0.25  # jobs on the CPU for at most this share of their busy time: off the CPU
GIL_BUDGET = 0.6  # threads of one process may use this much of a core between them
MAX_THREADS = 16  # the most threads advised
CPU_SHARE = 0.6  # a threaded process on the CPU this share of its busy time: CPU-bound
MEMORY_WORTH = 80  # percent: threads advised only where they would need at most this much memory
THREAD_COST = 2 * MIB  # what one more thread adds to a worker's RSS (its stack, its Redis connection)

# Recycling.
WARM_JOBS = 2  # a worker's first jobs import their code: its RSS from then on is the baseline
MIN_LEAK = 64 * 1024  # bytes a job: less is not worth a recycling limit
LEAK_T = 4.0  # the slope must be this many standard errors clear of zero
GROWTH_ALLOWED = 64 * MIB  # a worker may grow this much over its baseline (or by half, if more)

# Bounds.
DEFAULT_WAIT_TARGET = 10.0  # seconds, when the pool sets no max_wait
HELD_SHARE = 0.1  # held at max with jobs late for this share of the window
FLAPS = 3  # scale-downs undone within FLAP_GAP of each, with a job late for it, in the window
FLAP_LATE_AFTER = 10.0  # seconds after the scale-up that undid a down in which a late job counts


@dataclass(frozen=True, slots=True)
class JobSample:
    """One finished job."""

    at: float  # monotonic, when the master took it
    busy: float  # seconds, busy -> done
    cpu: float | None  # CPU seconds, as its `done` said; None: the worker did not say
    runq: float = 0.0  # seconds of `busy` it waited for a CPU (a busy host's, not the job's)


@dataclass(frozen=True, slots=True)
class RssSample:
    """A worker's RSS after some of its jobs."""

    at: float
    worker: int  # its pid
    jobs: int  # jobs it had finished
    rss: int  # bytes


@dataclass(frozen=True, slots=True)
class PoolSample:
    """The pool, once a second."""

    at: float
    running: int  # worker processes
    busy: int  # of them running a job
    jobs_running: int  # jobs at once (a threaded worker runs several)
    target: int
    oldest_age: float | None  # seconds its oldest waiting job had waited; None: not read
    backlog: int | None
    demand: int | None  # what its queues called for before the bounds


@dataclass(frozen=True, slots=True)
class Settings:
    """The pool's settings the advice weighs."""

    threads: int = 1
    floor: int = 1
    ceiling: int = 1
    autoscale: bool = True
    max_wait: float | None = None
    scale_down_delay: float = 30.0
    max_jobs: int | None = None
    max_memory: float | None = None  # MiB
    cap: int | None = None  # the most workers it may have: the cluster cap, the workers limit


@dataclass(frozen=True)
class Evidence:
    """What the advice about one pool rests on, oldest first."""

    pool: str
    settings: Settings
    jobs: Sequence[JobSample] = ()
    rss: Sequence[RssSample] = ()
    samples: Sequence[PoolSample] = ()


@dataclass(frozen=True, slots=True)
class Confidence:
    """What a piece of advice rests on."""

    jobs: int
    minutes: float


@dataclass(frozen=True, slots=True)
class Advice:
    pool: str
    kind: str  # threads, recycling, bounds
    reason: str  # REASONS
    text: str  # a person's sentence, with its figures
    change: dict[str, Any] = field(default_factory=dict)  # settings to set; {}: nothing to change
    figures: dict[str, float] = field(default_factory=dict)
    confidence: Confidence = Confidence(0, 0.0)

    def to_json(self) -> dict[str, Any]:
        """As status, the dashboard and `herder advise --json` show it (docs/advice.md)."""
        out: dict[str, Any] = asdict(self)
        return out


def _said(
    pool: str, kind: str, reason: str, text: str, change: dict[str, Any], figures: dict[str, float],
    jobs: int, minutes: float,
) -> Advice:  # fmt: skip
    return Advice(pool, kind, reason, text, change, figures, Confidence(jobs, minutes))


REASONS = {
    "threads": ("off_cpu", "cpu_bound_threads"),
    "recycling": ("rss_growth", "no_leak"),
    "bounds": ("held_at_max", "idle_min", "flapping"),
}


def advise(ev: Evidence) -> tuple[Advice, ...]:
    """Every piece of advice the evidence supports, in REASONS' order."""
    found = (threads_or_processes(ev), recycling(ev), held_at_max(ev), idle_min(ev), flapping(ev))
    return tuple(a for a in found if a is not None)


def actionable(advice: Sequence[Advice]) -> tuple[Advice, ...]:
    """The advice that asks for a change (a finding such as "no leak seen" asks for none)."""
    return tuple(a for a in advice if a.change)


def _minutes(first: float, last: float) -> float:
    return round(max(0.0, last - first) / 60, 1)


def _mib(n: float) -> str:
    return f"{n / MIB:.0f} MiB"


def _count(n: float, word: str) -> str:
    """ "1 worker", "2 workers"."""
    return f"{n:g} {word}{'' if n == 1 else 's'}"


# ---- threads or processes ----------------------------------------------------------------


def threads_or_processes(ev: Evidence) -> Advice | None:
    timed = [j for j in ev.jobs if j.cpu is not None]
    if len(timed) < MIN_JOBS or timed[-1].at - timed[0].at < MIN_SECONDS:
        return None
    # Of a job's busy time, the share on the CPU; the time it waited for one is left out: a
    # crowded host makes every job look off the CPU.
    busy = sum(max(j.busy - j.runq, j.cpu or 0.0) for j in timed)
    if busy <= 0:
        return None
    share = sum(j.cpu or 0.0 for j in timed) / busy
    s, minutes, n = ev.settings, _minutes(timed[0].at, timed[-1].at), len(timed)
    rss = _mean_rss(ev)
    running = [p.running for p in ev.samples if p.running]
    if s.threads == 1 and share <= IO_SHARE and s.ceiling >= 2:  # one job slot: nothing to share
        # As many as keep the GIL's one core from filling, and no more than the pool's job slots.
        fit = math.floor(GIL_BUDGET / max(share, GIL_BUDGET / MAX_THREADS))
        threads = max(2, min(MAX_THREADS, fit, s.ceiling))
        ceiling = max(1, math.ceil(s.ceiling / threads))
        change: dict[str, Any] = {"threads": threads}
        if s.autoscale:
            change.update(max_workers=ceiling, min_workers=max(0, math.ceil(s.floor / threads)))
        else:
            change.update(workers=ceiling)
        figures = {"cpu_share": round(share, 3), "threads": threads}
        memory = ""
        if rss and running:
            now = sum(running) / len(running)
            then = max(1, math.ceil(now / threads))
            before, after = now * rss, then * (rss + (threads - 1) * THREAD_COST)
            pct = round(100 * after / before) if before else 100
            if pct > MEMORY_WORTH:
                return None  # threads would save next to nothing: not worth the change
            figures.update(memory_now=round(before), memory_advised=round(after), memory_pct=pct)
            memory = f" at about {pct}% of their RSS ({_mib(after)} instead of {_mib(before)})"
        text = (
            f"jobs spend {100 * share:.0f}% of their busy time on the CPU: {threads} threads per "
            f"worker would serve the same {_count(s.ceiling * s.threads, 'job')} at once with "
            f"{_count(ceiling, 'worker')}{memory}"
        )
        return _said(ev.pool, "threads", "off_cpu", text, change, figures, n, minutes)
    if s.threads > 1:
        shares = [p.jobs_running / p.busy for p in ev.samples if p.busy]
        at_once = sum(shares) / len(shares) if shares else 1.0  # jobs a busy process runs together
        process = share * at_once  # of a core, while the process is busy
        if process >= CPU_SHARE and at_once > 1.2:
            workers = s.ceiling * s.threads
            change = {"threads": 1, "max_workers" if s.autoscale else "workers": workers}
            if s.autoscale:
                change["min_workers"] = s.floor * s.threads
            text = (
                f"jobs are CPU-bound: {at_once:.1f} threads at once share one core under the GIL "
                f"(each job on the CPU {100 * share:.0f}% of its busy time, the process "
                f"{100 * min(process, 1.0):.0f}%): threads = 1 with {workers} worker processes "
                "would run them side by side"
            )
            figures = {"cpu_share": round(share, 3), "process_cpu": round(process, 3)}
            return _said(ev.pool, "threads", "cpu_bound_threads", text, change, figures, n, minutes)
    return None


def _mean_rss(ev: Evidence) -> float | None:
    newest: dict[int, int] = {}
    for r in ev.rss:
        newest[r.worker] = r.rss
    return sum(newest.values()) / len(newest) if newest else None


# ---- recycling ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slope:
    per_job: float  # bytes a job
    error: float  # its standard error
    baseline: float  # bytes: the workers' mean RSS once warm
    jobs: int  # jobs it spans, over every worker
    workers: int


def rss_slope(samples: Sequence[RssSample]) -> Slope | None:
    """RSS against jobs, within each worker (each its own intercept: workers differ in size),
    from each one's warm-up on; None with too few jobs. One pass: sums per worker, each taken
    from its first reading (the loop asks every 5 s, over up to MAX readings a pool)."""
    sums: dict[int, list[float]] = {}  # worker -> [n, x0, y0, sx, sy, sxx, sxy, syy, x_max]
    for r in samples:
        if r.jobs < WARM_JOBS:
            continue
        acc = sums.get(r.worker)
        if acc is None:
            acc = sums[r.worker] = [0, r.jobs, r.rss, 0.0, 0.0, 0.0, 0.0, 0.0, r.jobs]
        x, y = r.jobs - acc[1], r.rss - acc[2]
        acc[0] += 1
        acc[3] += x
        acc[4] += y
        acc[5] += x * x
        acc[6] += x * y
        acc[7] += y * y
        acc[8] = max(acc[8], r.jobs)
    kept = [a for a in sums.values() if a[0] >= 2]
    span = sum(int(a[8] - a[1]) for a in kept)
    if span < MIN_JOBS:
        return None
    sxx = sum(a[5] - a[3] * a[3] / a[0] for a in kept)
    sxy = sum(a[6] - a[3] * a[4] / a[0] for a in kept)
    syy = sum(a[7] - a[4] * a[4] / a[0] for a in kept)
    if sxx <= 0:
        return None
    slope = sxy / sxx
    dof = sum(a[0] for a in kept) - len(kept) - 1
    error = math.sqrt(max(0.0, syy - slope * sxy) / dof / sxx) if dof > 0 else math.inf
    # Each worker's line at its warm start: its mean RSS less the slope times its mean jobs past it.
    baseline = sum(
        a[2] + a[4] / a[0] - slope * (a[1] + a[3] / a[0] - WARM_JOBS) for a in kept
    ) / len(kept)  # fmt: skip
    return Slope(slope, error, baseline, span, len(kept))


def recycling(ev: Evidence) -> Advice | None:
    slope = rss_slope(ev.rss)
    if slope is None or ev.rss[-1].at - ev.rss[0].at < MIN_SECONDS:
        return None
    s, minutes = ev.settings, _minutes(ev.rss[0].at, ev.rss[-1].at)
    figures = {
        "per_job": round(slope.per_job),
        "error": round(slope.error) if math.isfinite(slope.error) else -1,
        "baseline": round(slope.baseline),
        "workers": slope.workers,
    }
    leaking = slope.per_job >= MIN_LEAK and slope.per_job > LEAK_T * slope.error
    if not leaking:
        on = f"{_count(slope.jobs, 'job')} on {_count(slope.workers, 'worker')}"
        text = f"no leak seen over {on} (RSS {_mib(slope.baseline)})"
        return _said(ev.pool, "recycling", "no_leak", text, {}, figures, slope.jobs, minutes)
    bound = s.max_memory * MIB if s.max_memory else slope.baseline + max(GROWTH_ALLOWED, slope.baseline / 2)
    jobs = max(1, math.floor((bound - slope.baseline) / slope.per_job))
    figures.update(bound=round(bound), max_jobs=jobs)
    grows = (
        f"RSS grows {slope.per_job / MIB:.2f} MiB a job (±{slope.error / MIB:.2f}, over "
        f"{_count(slope.jobs, 'job')} on {_count(slope.workers, 'worker')}, from {_mib(slope.baseline)})"
    )
    if s.max_jobs is not None and s.max_jobs <= jobs:
        return None  # its recycling already keeps it under the bound
    if s.max_memory and s.max_jobs is None:
        # max_memory already retires a worker at the bound; max_jobs retires it before, planned.
        text = f"{grows}: max_memory = {s.max_memory:g} bounds it; max_jobs = {jobs} would recycle before it"
    else:
        mib = math.ceil(bound / MIB)
        text = f"{grows}: max_jobs = {jobs} keeps workers under {mib} MiB (or max_memory = {mib})"
    return _said(ev.pool, "recycling", "rss_growth", text, {"max_jobs": jobs}, figures, slope.jobs, minutes)


# ---- bounds ------------------------------------------------------------------------------


def _window(ev: Evidence, least: float) -> tuple[Sequence[PoolSample], float] | None:
    samples = ev.samples
    if len(samples) < 2 or samples[-1].at - samples[0].at < least:
        return None
    return samples, samples[-1].at - samples[0].at


def held_at_max(ev: Evidence) -> Advice | None:
    s = ev.settings
    got = _window(ev, MIN_SECONDS)
    if got is None or len(ev.jobs) < MIN_JOBS:
        return None
    samples, span = got
    target = s.max_wait if s.max_wait is not None else DEFAULT_WAIT_TARGET
    held = [
        p for p in samples if p.running >= s.ceiling and p.oldest_age is not None and p.oldest_age > target
    ]
    share = len(held) / len(samples)
    if share < HELD_SHARE:
        return None
    per_job = sum(j.busy for j in ev.jobs) / len(ev.jobs)  # seconds a job keeps a worker busy
    backlog = sorted(p.backlog or 0 for p in held)[int(0.9 * (len(held) - 1))]
    slots = s.threads
    # Enough more to drain the usual backlog (its 90th percentile) within the target.
    more = math.ceil(backlog * per_job / (target * slots))
    demand = sorted(p.demand or 0 for p in held)[int(0.9 * (len(held) - 1))]
    advised = max(s.ceiling + max(1, more), demand)
    capped = advised if s.cap is None else min(advised, s.cap)
    key = "max_workers" if s.autoscale else "workers"
    figures = {"share": round(share, 3), "wait_target": target, "backlog_p90": backlog, "advised": capped}
    minutes = _minutes(samples[0].at, samples[-1].at)
    late = (
        f"held at its max of {s.ceiling} for {100 * share:.0f}% of the last {span / 60:.1f} min while "
        f"jobs waited over {target:g} s (backlog up to {backlog})"
    )
    if capped <= s.ceiling:
        text = f"{late}; it is at its cap of {s.cap}: raise the cluster cap or the workers limit"
        return _said(ev.pool, "bounds", "held_at_max", text, {}, figures, len(ev.jobs), minutes)
    text = f"{late}: {key} = {capped} would keep waits near the target"
    if capped < advised:
        text += f" (the cap; {advised} would be needed)"
    return _said(ev.pool, "bounds", "held_at_max", text, {key: capped}, figures, len(ev.jobs), minutes)


def idle_min(ev: Evidence) -> Advice | None:
    s = ev.settings
    got = _window(ev, IDLE_SECONDS)
    if got is None or not s.autoscale or s.floor < 1:
        return None
    samples, span = got
    peak = max(math.ceil(p.jobs_running / s.threads) for p in samples)
    advised = peak + 1 if peak else 0  # one in hand above the busiest second
    if advised >= s.floor:
        return None
    text = (
        f"min_workers {s.floor} sat idle: at most {peak} worker{'s' if peak != 1 else ''} busy over "
        f"the last {span / 60:.0f} min; min_workers = {advised} would do"
    )
    figures = {"peak_busy": peak, "advised": advised}
    return _said(
        ev.pool, "bounds", "idle_min", text, {"min_workers": advised}, figures, len(ev.jobs),
        _minutes(samples[0].at, samples[-1].at),
    )  # fmt: skip


def _late(samples: Sequence[PoolSample], start: int, until: float, target: float) -> bool:
    """Whether the pool's oldest job waited past `target` from sample `start` until `until`."""
    for sample in samples[start:]:
        if sample.at > until:
            return False
        if sample.oldest_age is not None and sample.oldest_age > target:
            return True
    return False


def flapping(ev: Evidence) -> Advice | None:
    """A scale-down the need undid soon after, and a job waited past the target for it: the
    delay was too short for this load's lulls. A down undone at no wait costs only a start
    from the warm template, which a short delay is for: nothing to say."""
    s = ev.settings
    got = _window(ev, FLAP_SECONDS)
    if got is None or not s.autoscale:
        return None
    samples, span = got
    target = s.max_wait if s.max_wait is not None else DEFAULT_WAIT_TARGET
    gap = max(60.0, 2 * s.scale_down_delay)  # an up within this of a down undoes it
    down: int | None = None  # the sample of the last scale-down
    undone: list[float] = []
    for i in range(1, len(samples)):
        before, after = samples[i - 1], samples[i]
        if after.target < before.target:
            down = i
        elif after.target > before.target and down is not None:
            lull = after.at - samples[down].at
            if lull <= gap and _late(samples, down, after.at + FLAP_LATE_AFTER, target):
                undone.append(lull)
            down = None
    if len(undone) < FLAPS:
        return None
    undone.sort()
    longest = undone[int(0.75 * (len(undone) - 1))]
    # A lull must have lasted the delay and then the gap before the need came back.
    advised = int(math.ceil((s.scale_down_delay + longest) / 10) * 10)
    text = (
        f"scaled down and back up {len(undone)} times in {span / 60:.0f} min, each within "
        f"{longest:.0f} s of the scale-down and with a job waiting past {target:g} s: "
        f"scale_down_delay = {advised} would ride out those lulls"
    )
    figures = {"flaps": len(undone), "gap": round(longest, 1), "advised": advised}
    return _said(
        ev.pool, "bounds", "flapping", text, {"scale_down_delay": advised}, figures, len(ev.jobs),
        _minutes(samples[0].at, samples[-1].at),
    )  # fmt: skip
