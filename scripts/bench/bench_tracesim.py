"""The trace bench's pure half: the arrival traces, the peer autoscalers' rules, a discrete-time
simulator of a fleet that any of them drives, the offline oracle, the figures and the SVG chart.

No Redis, no processes, no clock: `scripts/bench/run traces` (bench_traces.py) replays the same
traces against real herder workers and drives them with the same rule objects; this module lets
the rules be compared in seconds instead of half an hour (`scripts/bench/run traces --simulate`),
and tests/test_scaling_traces.py holds herder's policy to winning here.

A rule sees what an outside scaler sees (the queue's length, its oldest job's age, the jobs
running, the fleet's size, and the jobs done and their busy seconds so far) every `interval`
seconds and answers a worker count, or None to leave it.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

# herder's policy, pure; the bench otherwise reaches herder only through its command line
from herder.supervisor.policy.scaling import Load, ScaleConfig, ScaleState, decide, learn_rate

# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class Job:
    at: float  # seconds since the trace began
    seconds: float  # how long it sleeps


@dataclass(frozen=True)
class Trace:
    name: str
    title: str
    jobs: tuple[Job, ...]
    length: float  # seconds the arrivals last
    compress: float  # real seconds each trace second stands for (the peers' scaled constants)

    @property
    def stands_for(self) -> str:
        """What the trace's length stands for, in words."""
        real = self.length * self.compress
        if real >= 86400 * 0.99:
            return f"{real / 86400:.3g} day" + ("s" if real > 86400 * 1.01 else "")
        if real >= 3600:
            hours = real / 3600
            return f"{hours:.3g} hour" + ("s" if round(hours, 2) != 1 else "")
        return f"{real / 60:.3g} minutes"


def lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def poisson(
    rng: random.Random, rate: Callable[[float], float], start: float, end: float, peak: float
) -> Iterator[float]:
    """Arrival times of a Poisson process of time-varying `rate` (jobs/s, at most `peak`), by thinning."""
    t = start
    while True:
        t += rng.expovariate(peak)
        if t >= end:
            return
        if rng.random() * peak < rate(t):
            yield t


LENGTH = 150.0  # seconds of arrivals per trace: six traces and ten policies fit in half an hour
MEDIAN = 0.4  # seconds: the typical job's median (lognormal, sigma SIGMA)
SIGMA = 0.6


def make_traces(seed: int = 54, length: float = LENGTH) -> list[Trace]:
    """The six traces, the same for every policy (seeded). Arrival rates stay within what 10
    workers serve (about 20 jobs/s of the typical job) except the spike, which lands at once."""
    L = length
    out = []

    def jobs_of(
        times: Iterator[float], rng: random.Random, median: float = MEDIAN, sigma: float = SIGMA
    ) -> list[Job]:
        return [Job(t, lognormal(rng, median, sigma)) for t in times]

    rng = random.Random(seed)
    step = jobs_of(poisson(rng, lambda t: 1.0 if t < 0.2 * L else 9.0, 0, L, 9.0), rng)
    out.append(
        Trace(
            "step",
            "a step: 1 job/s, then 9 jobs/s from 20% of the trace on",
            tuple(step),
            L,
            12.0,
        )
    )

    rng = random.Random(seed + 1)
    quiet = jobs_of(poisson(rng, lambda t: 0.3, 0, L, 0.3), rng)
    burst = [Job(0.2 * L + i * 0.002, lognormal(rng, 0.25, 0.5)) for i in range(250)]
    out.append(
        Trace(
            "spike",
            "a spike: 250 jobs of 0.25 s at once on a quiet queue (0.3 jobs/s)",
            tuple(sorted(quiet + burst, key=lambda j: j.at)),
            L,
            12.0,
        )
    )

    rng = random.Random(seed + 2)
    daily = jobs_of(poisson(rng, lambda t: 4.5 - 4.0 * math.cos(2 * math.pi * t / L), 0, L, 8.5), rng)
    out.append(
        Trace(
            "sine",
            "a daily curve: 0.5 to 8.5 jobs/s and back, one cycle",
            tuple(daily),
            L,
            86400 / L,
        )
    )

    rng = random.Random(seed + 3)
    period, on = L / 5, L / 15  # five bursts, each a third of its period

    def onoff(t: float) -> float:
        return 12.0 if (t % period) < on else 0.3

    bursts = jobs_of(poisson(rng, onoff, 0, L, 12.0), rng)
    out.append(
        Trace(
            "bursts",
            "on-off bursts: 12 jobs/s for 10 s every 30 s, 0.3 jobs/s between",
            tuple(bursts),
            L,
            20.0,
        )
    )

    rng = random.Random(seed + 4)
    ramp = jobs_of(poisson(rng, lambda t: 0.5 + 9.5 * t / L, 0, L, 10.0), rng)
    out.append(Trace("ramp", "a slow ramp: 0.5 to 10 jobs/s over the trace", tuple(ramp), L, 24.0))

    rng = random.Random(seed + 5)
    fast = jobs_of(poisson(rng, lambda t: 20.0, 0, L, 20.0), rng, 0.02, 0.3)
    slow = jobs_of(poisson(rng, lambda t: 0.8 if (t % 50) < 25 else 2.4, 0, L, 2.4), rng, 2.0, 0.3)
    out.append(
        Trace(
            "mix",
            "a mix on one queue: 20 jobs/s of 20 ms and 0.8 to 2.4 jobs/s of 2 s",
            tuple(sorted(fast + slow, key=lambda j: j.at)),
            L,
            12.0,
        )
    )
    return out


# ---------------------------------------------------------------- what a rule sees, and the rules


@dataclass(frozen=True)
class Seen:
    at: float
    backlog: int
    running: int
    oldest_age: float  # seconds the oldest waiting job has waited
    workers: int  # the fleet's size now (alive, starting included)
    done: int  # jobs finished so far
    busy: float  # their busy seconds, so far


# No rule looks more often than herder reads the load (its scale interval, 1 s): a scaled
# polling interval below it is raised to it, so every policy sees the queue as often.
POLL_FLOOR = 1.0


class Rule:
    """An autoscaler's rule: `interval` seconds between looks; `look` answers a count or None."""

    name = ""
    label = ""
    interval = 1.0

    def look(self, seen: Seen) -> int | None:
        raise NotImplementedError


@dataclass
class Bounds:
    floor: int = 1
    ceiling: int = 10
    target: float = 5.0  # the wait target, seconds

    def clamp(self, n: int) -> int:
        return max(self.floor, min(self.ceiling, n))


class Herder(Rule):
    """herder's own policy (supervisor.policy.scaling.decide), as herder's autoscaler folds it
    (Autoscaler.fold): only in the simulator; the real runs use herder's own autoscaler."""

    def __init__(self, b: Bounds, max_wait: float | None, **settings: float) -> None:
        self.name = "herder" if max_wait is None else "herder-wait"
        self.label = "herder" if max_wait is None else f"herder --max-wait {max_wait:g}"
        self.cfg = ScaleConfig(floor=b.floor, ceiling=b.ceiling, max_wait=max_wait, **settings)
        self.state = ScaleState()
        self.target = b.floor
        self.seen = (0, 0.0)

    def look(self, seen: Seen) -> int | None:
        jobs, busy = seen.done - self.seen[0], seen.busy - self.seen[1]
        self.seen = (seen.done, seen.busy)
        state = learn_rate(self.state, jobs, busy, self.cfg)
        load = Load(seen.at, seen.backlog, seen.running, seen.oldest_age)
        completions = (
            seen.running * state.per_worker if state.per_worker is not None else jobs / self.interval
        )
        decision, self.state = decide(state, load, self.target, completions, self.cfg)
        self.target = decision.target
        return self.target


class Fixed(Rule):
    def __init__(self, n: int, name: str) -> None:
        self.n, self.name, self.label = n, name, f"fixed at {n}"
        self.interval = 3600.0

    def look(self, seen: Seen) -> int | None:
        return self.n


class Judoscale(Rule):
    """Judoscale's rule for job queues as its documentation gives it: the queue's latency (the
    oldest job's age), reported in 10 s aggregates; above the upscale threshold, one more worker
    ("upscale jumps" 1), then no upscale for the upscale frequency (3 min); below the downscale
    threshold for the downscale delay (10 min), one fewer, and again a delay later. Thresholds:
    the wait target up, a fifth of it down."""

    def __init__(self, b: Bounds, scale: float = 1.0) -> None:
        self.b, self.scale = b, scale
        self.name = "judoscale" if scale == 1 else "judoscale-scaled"
        self.label = "Judoscale-like" + ("" if scale == 1 else " (scaled)")
        self.interval = max(POLL_FLOOR, 10.0 / scale)
        self.up_every, self.down_delay = 180.0 / scale, 600.0 / scale
        self.last_up: float | None = None
        self.low_since: float | None = None
        self.n: int | None = None

    def look(self, seen: Seen) -> int | None:
        n = seen.workers if self.n is None else self.n
        if seen.oldest_age > self.b.target:
            self.low_since = None
            if self.last_up is None or seen.at - self.last_up >= self.up_every:
                self.last_up, n = seen.at, n + 1
        elif seen.oldest_age < self.b.target / 5:
            if self.low_since is None:
                self.low_since = seen.at
            elif seen.at - self.low_since >= self.down_delay:
                self.low_since, n = seen.at, n - 1  # the next step down a whole delay later
        else:
            self.low_since = None
        self.n = self.b.clamp(n)
        return self.n


class HireFire(Rule):
    """HireFire's job-queue rule: workers from the jobs queued and running by its job/worker
    ratio (the documented default table: 1 job -> 1 worker, then one more per 25 jobs), checked
    every minute; a downscale only after a minute of lower need."""

    def __init__(self, b: Bounds, scale: float = 1.0) -> None:
        self.b = b
        self.name = "hirefire" if scale == 1 else "hirefire-scaled"
        self.label = "HireFire-like" + ("" if scale == 1 else " (scaled)")
        self.interval = max(POLL_FLOOR, 60.0 / scale)
        self.down_after = 60.0 / scale
        self.low_since: float | None = None
        self.n: int | None = None

    def look(self, seen: Seen) -> int | None:
        jobs = seen.backlog + seen.running
        want = self.b.clamp(0 if jobs == 0 else 1 + jobs // 25)
        n = seen.workers if self.n is None else self.n
        if want >= n:
            self.low_since, n = None, want
        elif self.low_since is None:
            self.low_since = seen.at
        elif seen.at - self.low_since >= self.down_after:
            self.low_since, n = None, want
        self.n = n
        return n


class Keda(Rule):
    """KEDA's Redis-list scaler under the HPA, with their documented defaults: the metric is the
    list's length, polled every 30 s (pollingInterval), and its target 5 per replica (listLength):
    replicas = ceil(length / 5), left alone within the HPA's 10 % tolerance; up by at most
    max(100 %, 4 pods) per 15 s (the HPA's scale-up policy); down only to the highest
    recommendation of the last 300 s (its scale-down stabilization window; KEDA's cooldownPeriod
    is the same 300 s)."""

    def __init__(self, b: Bounds, scale: float = 1.0) -> None:
        self.b = b
        self.name = "keda" if scale == 1 else "keda-scaled"
        self.label = "KEDA-like" + ("" if scale == 1 else " (scaled)")
        self.interval = max(POLL_FLOOR, 30.0 / scale)
        self.window = 300.0 / scale
        self.period = 15.0 / scale
        self.recent: deque[tuple[float, int]] = deque()
        self.ups: deque[tuple[float, int]] = deque()  # (when, count before) of recent scale-ups

    def look(self, seen: Seen) -> int | None:
        n = max(1, seen.workers)
        ratio = seen.backlog / (5 * n)
        want = n if abs(ratio - 1) <= 0.1 else self.b.clamp(math.ceil(seen.backlog / 5))
        self.recent.append((seen.at, want))
        while self.recent and self.recent[0][0] < seen.at - self.window:
            self.recent.popleft()
        while self.ups and self.ups[0][0] < seen.at - self.period:
            self.ups.popleft()
        if want > n:
            base = min([n] + [c for _, c in self.ups])  # the count at the start of the period
            want = min(want, max(2 * base, base + 4))
            if want > n:
                self.ups.append((seen.at, n))
            return want
        return max(w for _, w in self.recent)


class Schedule(Rule):
    """A count every ORACLE_STEP seconds, decided beforehand (the oracle's)."""

    def __init__(self, counts: list[int], name: str = "oracle", label: str = "oracle (hindsight)") -> None:
        self.counts, self.name, self.label = counts, name, label
        self.interval = ORACLE_STEP

    def look(self, seen: Seen) -> int | None:
        return self.counts[min(len(self.counts) - 1, int(seen.at / ORACLE_STEP + 1e-9))]


def peers(b: Bounds, scale: float) -> list[Rule]:
    """The peer rules with their documented time constants, and scaled as the trace's time is."""
    return [cls(b, s) for cls in (Judoscale, HireFire, Keda) for s in (1.0, scale)]


# ---------------------------------------------------------------- the simulator


@dataclass
class Fleet:
    """The simulated workers: each a slot free at `free_at`, taken by FIFO jobs; a new worker
    takes jobs `start_delay` after it is asked for; a shrink stops idle workers only."""

    start_delay: float = 0.5
    workers: list[float] = field(default_factory=list)  # when each worker is free (or ready)
    stopping: list[float] = field(default_factory=list)  # busy workers told to stop: end of their job

    def resize(self, n: int, now: float) -> None:
        while len(self.workers) < n:
            self.workers.append(now + self.start_delay)
        if len(self.workers) > n:  # idle first, then the busy ones stop when their job ends
            self.workers.sort()
            excess = len(self.workers) - n
            idle = [w for w in self.workers if w <= now]
            drop_idle = min(excess, len(idle))
            self.workers = self.workers[drop_idle:]
            # busy ones stay until done (never interrupted); herder does not stop them either,
            # a later pass does when they are idle: keep them, counted, until the next resize


@dataclass
class Outcome:
    name: str
    label: str
    waits: list[float]
    worker_seconds: float
    scale_events: int
    timeline: list[tuple[float, int, int]]  # (t, workers, waiting) every second


def simulate(
    trace: Trace, rule: Rule, b: Bounds, dt: float = 0.05, start_delay: float = 0.5, tail: float = 60.0
) -> Outcome:
    """Drive a fleet with `rule` through `trace` in steps of `dt`: FIFO, one job per worker."""
    jobs = deque(trace.jobs)
    queue: deque[Job] = deque()
    running: list[tuple[float, float]] = []  # (end, seconds)
    fleet = Fleet(start_delay)
    first = (
        rule.look(Seen(0.0, 0, 0, 0.0, b.floor, 0, 0.0)) if isinstance(rule, Fixed | Schedule) else b.floor
    )
    n = b.clamp(first if first is not None else b.floor)
    fleet.resize(n, 0.0)
    waits: list[float] = []
    done, busy, events = 0, 0.0, 0
    worker_seconds = 0.0
    next_look = rule.interval if not isinstance(rule, Schedule) else 0.0
    timeline: list[tuple[float, int, int]] = []
    steps = int(round((trace.length + tail) / dt))
    for i in range(steps + 1):
        now = i * dt
        while jobs and jobs[0].at <= now:
            queue.append(jobs.popleft())
        still = []
        for end, seconds in running:
            if end <= now:
                done, busy = done + 1, busy + seconds
            else:
                still.append((end, seconds))
        running = still
        if now + 1e-9 >= next_look:
            seen = Seen(
                now,
                len(queue),
                len(running),
                now - queue[0].at if queue else 0.0,
                len(fleet.workers),
                done,
                busy,
            )
            want = rule.look(seen)
            next_look = now + rule.interval
            if want is not None and want != n:
                n, events = b.clamp(want), events + 1
            fleet.resize(n, now)
        elif len(fleet.workers) > n:
            fleet.resize(n, now)  # workers that finished their job since: stop them now
        fleet.workers.sort()
        for k, free in enumerate(fleet.workers):
            if not queue:
                break
            if free <= now:
                job = queue.popleft()
                start = max(now, job.at)
                waits.append(start - job.at)
                fleet.workers[k] = start + job.seconds
                running.append((start + job.seconds, job.seconds))
        if now < trace.length:
            worker_seconds += len(fleet.workers) * dt
        if i % int(round(1 / dt)) == 0:
            timeline.append((now, len(fleet.workers), len(queue)))
        if (
            now >= trace.length
            and not queue
            and not jobs
            and not running
            and len(timeline) > trace.length + 5
        ):
            break
    now = steps * dt
    waits += [now - j.at for j in queue]  # never started: counted as waiting to the end
    return Outcome(rule.name, rule.label, waits, worker_seconds, events, timeline)


# ---------------------------------------------------------------- the oracle


def _sized(workers: list[float], want: int, now: float, start_delay: float) -> list[float]:
    """The fleet (when each worker is free) at `want` workers, sorted: new ones free once
    started, and only idle ones stopped (a busy one finishes its job first)."""
    if len(workers) < want:
        workers = workers + [now + start_delay] * (want - len(workers))
    elif len(workers) > want:
        workers = sorted(workers)
        idle = sum(1 for w in workers if w <= now)
        workers = workers[min(idle, len(workers) - want) :]
    workers.sort()
    return workers


def replay(trace: Trace, counts: list[int], b: Bounds, start_delay: float) -> list[float]:
    """A fast FIFO replay of `counts` (one per ORACLE_STEP): each job's wait, in trace order
    (a job not started by the end of `counts` waits until then)."""
    dt = 0.05
    jobs = trace.jobs
    k = 0
    queue: deque[int] = deque()
    workers: list[float] = []
    waits = [0.0] * len(jobs)
    end = len(counts) * ORACLE_STEP
    now = 0.0
    for i in range(int(end / dt) + 1):
        now = i * dt
        while k < len(jobs) and jobs[k].at <= now:
            queue.append(k)
            k += 1
        workers = _sized(
            workers, counts[min(len(counts) - 1, int(now / ORACLE_STEP + 1e-9))], now, start_delay
        )
        for w, free in enumerate(workers):
            if not queue:
                break
            if free <= now:
                j = queue.popleft()
                waits[j] = now - jobs[j].at
                workers[w] = now + jobs[j].seconds
        if k >= len(jobs) and not queue:
            break
    for j in queue:
        waits[j] = now - jobs[j].at
    for j in range(k, len(jobs)):
        waits[j] = end - jobs[j].at
    return waits


ORACLE_STEP = 1.0  # seconds between the oracle's decisions


def oracle(trace: Trace, b: Bounds, start_delay: float = 0.5, tail: float = 60.0) -> list[int]:
    """The fewest workers, second by second, that keep every job within the wait target, in
    hindsight (a job no fleet within the bounds serves in time, such as the spike's, may wait
    as long as it would at the maximum). It knows every arrival and duration; its workers still
    take `start_delay` to start and are stopped only when idle. Not a proven minimum: the best
    of a few schedules, a greedy one (workers as late as they can be) and others (the work
    arriving around each second spread over windows of a half, one and two targets, or the
    minimum throughout) repaired where a job would wait too long and trimmed of every
    worker-second the waiting does not need."""
    steps = int((trace.length + tail) / ORACLE_STEP)
    most = replay(trace, [b.ceiling] * steps, b, start_delay)
    allowed = [max(b.target, w) + 1e-6 for w in most]
    work = [0.0] * steps
    for job in trace.jobs:
        work[min(steps - 1, int(job.at / ORACLE_STEP))] += job.seconds
    best = _greedy(trace, steps, b, start_delay, allowed)
    for window in (0.0, 0.5 * b.target, b.target, 2 * b.target):
        half = int(window / 2 / ORACLE_STEP)
        if window:
            counts = [
                b.clamp(
                    math.ceil(sum(work[max(0, i - half) : i + half + 1]) / max(ORACLE_STEP, window) - 1e-9)
                )
                for i in range(steps)
            ]
        else:
            counts = [b.floor] * steps
        counts = _trim(trace, _repair(trace, counts, b, start_delay, allowed), b, start_delay, allowed)
        if sum(counts) < sum(best):
            best = counts
    return best


def _greedy(trace: Trace, steps: int, b: Bounds, start_delay: float, allowed: list[float]) -> list[int]:
    """Second by second, the least count after which the maximum from the next second on still
    keeps every job that arrived by then within what it is allowed: workers as late as they can be."""
    counts = [b.ceiling] * steps
    fleet = _Fleet(trace, start_delay, allowed)
    for s in range(steps):
        at_s = fleet.at_step(counts, s)
        lo, hi = b.floor, b.ceiling
        while lo < hi:
            mid = (lo + hi) // 2
            counts[s] = mid
            if fleet.late(counts, at_s) is None:
                hi = mid
            else:
                lo = mid + 1
        counts[s] = lo
    return counts


def _repair(
    trace: Trace, counts: list[int], b: Bounds, start_delay: float, allowed: list[float]
) -> list[int]:
    """One more worker, ready by the first late job's deadline, until no job is late."""
    counts = list(counts)
    fleet = _Fleet(trace, start_delay, allowed)
    s = 0
    while (j := fleet.late(counts, fleet.at_step(counts, s))) is not None:
        deadline = trace.jobs[j].at + allowed[j]
        s = max(0, min(len(counts) - 1, int(deadline / ORACLE_STEP)))  # keep or start one then
        while s >= 0 and counts[s] >= b.ceiling:
            s -= 1
        if s < 0:
            break  # cannot be helped within the bounds
        counts[s] += 1
        fleet.forget_after(s)
    return counts


def _trim(trace: Trace, counts: list[int], b: Bounds, start_delay: float, allowed: list[float]) -> list[int]:
    """One fewer worker in any second where no job then waits longer than it is allowed."""
    counts = list(counts)
    fleet = _Fleet(trace, start_delay, allowed)
    for _ in range(2):
        changed = False
        for s in sorted(range(len(counts)), key=lambda i: -counts[i]):
            if counts[s] <= b.floor:
                continue
            at_s = fleet.at_step(counts, s)
            counts[s] -= 1
            if fleet.late(counts, at_s) is None:
                changed = True
                fleet.forget_after(s)
            else:
                counts[s] += 1
        if not changed:
            break
    return counts


@dataclass
class _State:
    """replay's state at the start of a tick: what the ticks before it left."""

    tick: int = 0
    arrived: int = 0  # jobs arrived so far (they arrive in trace order)
    queue: deque[int] = field(default_factory=deque)
    workers: list[float] = field(default_factory=list)  # when each is free
    late: int | None = None  # the first job the ticks before it left waiting too long

    def copy(self) -> _State:
        return _State(self.tick, self.arrived, deque(self.queue), list(self.workers), self.late)


class _Fleet:
    """replay's fleet for the oracle's search, which asks again and again whether a schedule
    leaves a job late, each time with one second's count changed. The ticks before a second do
    not read its count, so a question resumes from the fleet as it was at that second (kept
    for the schedule last asked about) and ends at the first late job. Same ticks, same
    answers as replay's waits compared with what each job is allowed."""

    def __init__(self, trace: Trace, start_delay: float, allowed: list[float]) -> None:
        self.jobs, self.start_delay, self.allowed = trace.jobs, start_delay, allowed
        self.kept: dict[int, _State] = {0: _State()}  # second -> the fleet at its start

    def forget_after(self, s: int) -> None:
        """The schedule changed at second s: what was kept from later seconds no longer holds."""
        self.kept = {k: v for k, v in self.kept.items() if k <= s}

    def at_step(self, counts: list[int], s: int) -> _State:
        """The fleet at the start of second s under `counts` (whose seconds before s are those
        of every schedule asked about since the last forget_after at or before s)."""
        if s not in self.kept:
            start = max(k for k in self.kept if k < s)
            self._run(counts, self.kept[start].copy(), until=s)
        return self.kept[s]

    def late(self, counts: list[int], at: _State) -> int | None:
        """The first job (in arrival order) that waits longer than it is allowed under `counts`,
        or None, from the fleet `at` (unchanged: the run works on a copy)."""
        return at.late if at.late is not None else self._run(counts, at.copy())

    def _run(self, counts: list[int], st: _State, until: int | None = None) -> int | None:
        # replay's loop, tick for tick. A FIFO queue starts jobs in arrival order, so the first
        # job seen waiting too long (started late, or at the queue's head past its deadline) is
        # the first late one. With `until`, it keeps the fleet at each second's start up to that
        # one, with the first late job so far, and returns None.
        dt, jobs, allowed, judge = 0.05, self.jobs, self.allowed, until is None
        queue, workers, k, first = st.queue, st.workers, st.arrived, st.late
        end = len(counts) * ORACLE_STEP
        last = int(end / dt)
        now = st.tick * dt
        for i in range(st.tick, last + 1):
            now = i * dt
            step = int(now / ORACLE_STEP + 1e-9)
            if until is not None and step not in self.kept:
                self.kept[step] = _State(i, k, deque(queue), list(workers), first)
                if step >= until:
                    return None
            while k < len(jobs) and jobs[k].at <= now:
                queue.append(k)
                k += 1
            workers = _sized(workers, counts[min(len(counts) - 1, step)], now, self.start_delay)
            for w, free in enumerate(workers):
                if not queue:
                    break
                if free <= now:
                    j = queue.popleft()
                    if first is None and now - jobs[j].at > allowed[j]:
                        first = j
                        if judge:
                            return j
                    workers[w] = now + jobs[j].seconds
            if first is None and queue and now - jobs[queue[0]].at > allowed[queue[0]]:
                first = queue[0]
                if judge:
                    return first
            if judge and k >= len(jobs) and not queue:
                return None
        if not judge:
            return None
        # Left at the end, as replay reckons their waits: those queued until then, those not arrived.
        queued = (j for j in queue if now - jobs[j].at > allowed[j])
        return next(queued, next((j for j in range(k, len(jobs)) if end - jobs[j].at > allowed[j]), None))


# ---------------------------------------------------------------- figures


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]


@dataclass(frozen=True)
class Figures:
    over: float  # seconds jobs waited beyond the target, summed
    late: int  # jobs that waited beyond it
    p95: float
    p99: float
    worker_seconds: float
    events: int


def figures(waits: list[float], worker_seconds: float, events: int, target: float) -> Figures:
    return Figures(
        over=sum(max(0.0, w - target) for w in waits),
        late=sum(1 for w in waits if w > target),
        p95=percentile(waits, 0.95),
        p99=percentile(waits, 0.99),
        worker_seconds=worker_seconds,
        events=events,
    )


def beats(a: Figures, b: Figures, slack: float = 0.0) -> bool:
    """`a` is no worse than `b` on both counts (waiting over the target, worker-seconds), with
    `slack` seconds of waiting forgiven as noise: less waiting at no more worker-seconds, or fewer
    worker-seconds at no more waiting."""
    return a.over <= b.over + slack and a.worker_seconds <= b.worker_seconds + 1e-6


# ---------------------------------------------------------------- the chart

COLOURS = {
    "herder": "#1f77b4",
    "herder-wait": "#d62728",
    "fixed-min": "#7f7f7f",
    "fixed-max": "#bcbd22",
    "judoscale": "#2ca02c",
    "judoscale-scaled": "#2ca02c",
    "hirefire": "#9467bd",
    "hirefire-scaled": "#9467bd",
    "keda": "#ff7f0e",
    "keda-scaled": "#ff7f0e",
    "oracle": "#000000",
    "oracle-tight": "#8c564b",
}


def svg_chart(title: str, series: list[tuple[str, str, list[tuple[float, int, int]]]], length: float) -> str:
    """Two panels, workers and waiting jobs over time, one line per policy (`series`: name,
    label, (t, workers, waiting) samples); written with the standard library only."""
    width, panel, left, top, gap = 900, 190, 60, 40, 40
    legend_h = 20 * ((len(series) + 2) // 3)
    height = top + 2 * panel + gap + 40 + legend_h
    t_max = length + 30  # the trace and the drain after it
    series = [(n, lab, [p for p in s if p[0] <= t_max]) for n, lab, s in series]
    w_max = max([1] + [p[1] for _, _, s in series for p in s])
    # The fleet held at the minimum queues up far more than any other: off the scale, clipped.
    q_max = max([1] + [p[2] for n, _, s in series if n != "fixed-min" for p in s])
    plot_w = width - left - 20

    def x(t: float) -> float:
        return left + plot_w * t / t_max

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"'
        ' font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="13">{_esc(title)}</text>',
    ]
    for p, (key, y_max, what) in enumerate(
        ((1, w_max, "workers"), (2, q_max, "jobs waiting (fixed at min clipped)"))
    ):
        y0 = top + p * (panel + gap)

        def y(v: float, y0: int = y0, y_max: float = y_max) -> float:
            return y0 + panel - panel * min(v, y_max) / y_max

        out.append(f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel}" fill="none" stroke="#999"/>')
        for frac in (0, 0.5, 1):
            v = y_max * frac
            out.append(f'<text x="{left - 5}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
        out.append(
            f'<text x="12" y="{y0 + panel / 2}" transform="rotate(-90 12 {y0 + panel / 2})"'
            f' text-anchor="middle">{what}</text>'
        )
        for name, _, samples in series:
            if not samples:
                continue
            dash = (
                ' stroke-dasharray="5,3"'
                if name in ("judoscale", "hirefire", "keda", "fixed-min", "fixed-max")
                else ""
            )
            width_ = 2.2 if name in ("herder", "herder-wait", "oracle", "oracle-tight") else 1.2
            pts = " ".join(f"{x(s[0]):.1f},{y(s[key]):.1f}" for s in samples)
            out.append(
                f'<polyline fill="none" stroke="{COLOURS.get(name, "#333")}" stroke-width="{width_}"'
                f'{dash} points="{pts}"/>'
            )
    axis_y = top + 2 * panel + gap
    for t in range(0, int(t_max) + 1, 30):
        out.append(f'<text x="{x(t):.1f}" y="{axis_y + 12}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{axis_y + 28}" text-anchor="middle">seconds</text>')
    for i, (name, label, _) in enumerate(series):
        lx, ly = left + (i % 3) * 280, axis_y + 48 + 20 * (i // 3)
        dash = (
            ' stroke-dasharray="5,3"'
            if name in ("judoscale", "hirefire", "keda", "fixed-min", "fixed-max")
            else ""
        )
        out.append(
            f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 24}" y2="{ly - 4}"'
            f' stroke="{COLOURS.get(name, "#333")}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{lx + 30}" y="{ly}">{_esc(label)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
