"""The autoscaling policy: a pure function from what was observed to a worker count.

No I/O and no clock of its own, so it is unit- and property-tested directly
(tests/test_scaling_policy.py, tests/test_scaling_wait.py); docs/scaling.md explains the formula.

The fleet is sized for a wait: the target (`max_wait`), or without one DEFAULT_WAIT (1 s):

    need = max( floor(arrival / rate), min(backlog / (rate * WAIT_SHARE * W), running + backlog) )

the whole workers the arrivals keep busy, or enough that the newest waiting job starts within
a share of the wait W (FIFO: only the jobs ahead of it delay it), whichever is more; never more
than one worker per job there is to do. The queue is the buffer: a fraction of a worker's load
waits in it instead of costing a whole worker. The arrival rate is smoothed (over the target, or
DEFAULT_ARRIVAL_SPAN without one) from the jobs done, and the job rate pooled (jobs over busy
seconds, each smoothed) so that a mix of fast and slow jobs is not misjudged by whichever
finished last; a waiting job older than W adds a worker at every reading. The drain target caps
W (the backlog is emptied within it at the latest). Before the per-worker rate is known (cold
start) every waiting job counts as one worker's worth, which errs towards draining fast.

Up at once; down only after `need` has stayed below the current count for the scale-down delay
(with a target, at most half of it: WAIT_DOWN), to the highest need of that time. Without a
target also plus as much headroom as the need varied within it, and by a real step (DOWN_STEP),
so a noisy load does not flap: a load that is truly gone varies by nothing and goes all the way
down. (With a target the queue absorbs the noise and a late job adds a worker: no headroom.)

`unrounded_need` is the first rule (empty the backlog within the drain target, arrivals counted
on top of the jobs running); it now gives only the cold start's count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from herder.supervisor.children.states import WorkerState
from herder.supervisor.redis_side.load import Load  # the load reader's reading, the policy's input

# A scale-down sheds at least this share of the fleet and at least 2 workers, unless the
# need was perfectly flat for the whole delay (the load is gone, or truly constant): a
# smaller step down is most likely the noise missing its peak for a while, and comes back.
DOWN_STEP = 0.1

# The newest waiting job should start within this share of the wait the fleet is sized for (the
# rest is margin for a worker's start and for the estimates' error).
WAIT_SHARE = 0.5
# With a wait target: a scale-down waits at most this share of it (or the scale-down delay, if
# shorter): the queue buffers the load's noise and a late job adds a worker at once, so a fleet
# sized for a burst need not idle for the whole delay after it; a worker stopped too soon costs
# a start from the warm template, well within the other half of the target.
WAIT_DOWN = 0.5
# Without a wait target the fleet is still sized for one, this tight (seconds): waits stay around
# a second. (The drain target of the first rule, emptying the queue within 30 s of arrivals counted
# on top of the jobs running, kept every worker a burst had started and spent 1.5x to 3.3x the
# worker-seconds of the fewest that hold every job within a second, on the trace bench.)
DEFAULT_WAIT = 1.0
# Without a wait target: the arrival rate is smoothed over this many seconds (with one, over the
# target), so that a jittery backlog is not read as arrivals that would keep whole workers busy.
DEFAULT_ARRIVAL_SPAN = 5.0
# Weight of the newest interval in the pooled job rate (jobs and busy seconds each smoothed).
POOL_WEIGHT = 0.2


@dataclass(frozen=True)
class ScaleConfig:
    """The policy's settings. It counts JOB SLOTS (a worker runs `threads` jobs at once): its
    floor and ceiling are the pool's (Config's floor and ceiling, in workers) times threads,
    and with a cluster cap the ceiling is the whole cluster's; the autoscaler turns its target
    back into this host's workers (herder.supervisor.policy.autoscaler)."""

    floor: int  # job slots
    ceiling: int  # job slots
    scale_down_delay: float = 2.0
    drain_target: float = 30.0
    # The latency target (`max_wait`): no waiting job should wait longer than this; None: none.
    max_wait: float | None = None
    # Smoothing of the per-worker rate: weight of the newest sample. (The growth rate is
    # smoothed over the drain target instead: see decide.)
    alpha: float = 0.5


@dataclass(frozen=True)
class ScaleState:
    """What the policy remembers between intervals."""

    last: Load | None = None
    growth: float = 0.0  # EWMA of d(backlog)/dt, jobs per second
    per_worker: float | None = None  # EWMA of completions per busy worker per second
    low_since: float | None = None  # when need first fell below the current count
    # With a wait target: the arrival rate (jobs/s) smoothed over the target, and the jobs done
    # and busy seconds per interval, each smoothed: their ratio is the pooled job rate.
    arrival: float | None = None
    jobs_avg: float = 0.0
    busy_avg: float = 0.0
    # (at, unrounded need) of the observations of the last scale_down_delay seconds
    recent: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Decision:
    target: int  # job slots, within the bounds
    need: int
    reason: str
    # What the load calls for before any bound (floor, ceiling): for a scaler outside herder
    # (KEDA: herder_workers_wanted) that adds hosts when one host's ceiling is not enough.
    demand: int = 0


def clamp(value: int, cfg: ScaleConfig) -> int:
    """`value` within the bounds: the policy's one way to apply them."""
    return max(cfg.floor, min(cfg.ceiling, value))


def learn_rate(state: ScaleState, completed: int, busy_seconds: float, cfg: ScaleConfig) -> ScaleState:
    """Fold `completed` jobs over `busy_seconds` of worker time into the per-worker rate."""
    if not busy_seconds > 0 or not completed > 0:  # (NaN too)
        return state
    sample = completed / busy_seconds
    if not math.isfinite(sample):  # a vanishing busy time: no information, and inf * 0 is NaN
        return state
    rate = sample if state.per_worker is None else cfg.alpha * sample + (1 - cfg.alpha) * state.per_worker
    if state.per_worker is None:
        jobs, busy = float(completed), busy_seconds
    else:
        jobs = POOL_WEIGHT * completed + (1 - POOL_WEIGHT) * state.jobs_avg
        busy = POOL_WEIGHT * busy_seconds + (1 - POOL_WEIGHT) * state.busy_avg
    return replace(state, per_worker=rate, jobs_avg=jobs, busy_avg=busy)


def pooled_rate(state: ScaleState) -> float | None:
    """Jobs per busy worker-second over the recent intervals, pooled: the mean job's rate. Unlike
    an average of each interval's rate it is not swayed by a burst of fast jobs finishing while
    slow ones still run."""
    if not state.busy_avg > 0 or not state.jobs_avg > 0:
        return state.per_worker  # (a memory from before the pooled figures: the plain rate)
    return state.jobs_avg / state.busy_avg


def unrounded_need(
    load: Load, growth: float, per_worker: float | None, completions: float, cfg: ScaleConfig
) -> float:
    """Workers (unrounded) to keep up with arrivals and drain the backlog within the drain
    target: the formula in the module doc."""
    if load.backlog <= 0 and growth <= 0:
        return load.running
    if per_worker is None or per_worker <= 0:
        return load.running + load.backlog  # cold start: one worker per waiting job
    arrival = max(0.0, growth + completions)  # jobs/s coming in = growth + what is being done
    # With a latency target the backlog must drain within it: a job waits about as long
    # as the work ahead of it takes the fleet.
    t = cfg.drain_target if cfg.max_wait is None else min(cfg.drain_target, cfg.max_wait)
    extra = (arrival * t + load.backlog) / (per_worker * t)
    # Running jobs are already covered by `arrival` when the fleet keeps up; never go below them.
    return max(load.running, extra)


def smoothed_growth(previous: float, last: Load | None, load: Load, drain_target: float) -> float:
    """The backlog's growth rate (jobs/s), folding in the newest pair of readings.

    Smoothed over the drain target it is projected across: `need` weighs growth T/dt times
    more than the backlog it comes from, so a per-interval weight like alpha would turn a
    jittery backlog into swings of many workers. Status shows each queue's growth smoothed
    the same way.
    """
    if last is None or not load.at > last.at:
        return previous
    dt = load.at - last.at
    sample = (load.backlog - last.backlog) / dt
    weight = dt / (dt + drain_target)
    return weight * sample + (1 - weight) * previous


def smoothed_arrival(
    previous: float | None, last: Load | None, load: Load, completions: float, tau: float
) -> float | None:
    """Jobs arriving per second (the backlog's change plus the jobs being done), smoothed over
    `tau` seconds from the completions of the first pair of readings; None until then."""
    if last is None or not load.at > last.at:
        return previous
    dt = load.at - last.at
    # Not clamped at 0: a backlog that lands and then drains adds and takes back as much, so
    # a spike leaves no arrival rate behind once it is gone (the reader clamps the estimate).
    sample = (load.backlog - last.backlog) / dt + completions
    if previous is None:  # one interval's change of a jittery backlog is not a rate: start from the jobs done
        previous = completions
    weight = dt / (dt + tau)
    return weight * sample + (1 - weight) * previous


def sizing_wait(cfg: ScaleConfig) -> float:
    """The wait the fleet is sized for: the target (`max_wait`), or without one DEFAULT_WAIT."""
    return cfg.max_wait if cfg.max_wait is not None else DEFAULT_WAIT


def waiting_need(load: Load, arrival: float | None, rate: float | None, cfg: ScaleConfig) -> float:
    """Workers (unrounded) to hold the wait the fleet is sized for: the formula in the module doc."""
    if rate is None or rate <= 0:
        return unrounded_need(load, 0.0, None, 0.0, cfg)  # cold start: one worker per waiting job
    if load.backlog <= 0 and load.running <= 0:
        return 0.0  # an empty queue and an idle fleet: nothing to keep (the delay still holds it)
    t = WAIT_SHARE * min(cfg.drain_target, sizing_wait(cfg))
    keep = max(0.0, arrival or 0.0) / rate  # workers the arrivals keep busy
    if not math.isfinite(keep):  # a rate too large to multiply (a vanishing busy time): the jobs running
        keep = float(load.running)
    # ... but never more than there are jobs to do: a jittery backlog of slow jobs reads as arrivals
    # that would keep many workers busy.
    busy = math.floor(min(keep, load.running + load.backlog) + 1e-9)
    # A waiting job starts as soon as it has a worker: jobs slower than the target need one
    # each, never the many that would finish them all within it.
    drain = min(load.backlog / (rate * t), load.running + load.backlog)
    return max(float(busy), drain)


def wait_name(cfg: ScaleConfig) -> str:
    """The wait the fleet is sized for, in the scale line's words."""
    if cfg.max_wait is None:
        return f"sized for {DEFAULT_WAIT:g} s without max_wait"
    return f"max wait {cfg.max_wait:g} s"


def down_delay(cfg: ScaleConfig) -> float:
    """How long the need must stay below the count before a scale-down."""
    if cfg.max_wait is None:
        return cfg.scale_down_delay
    return min(cfg.scale_down_delay, WAIT_DOWN * cfg.max_wait)


def decide(
    state: ScaleState,
    load: Load | None,
    current: int,
    completions_per_s: float,
    cfg: ScaleConfig,
) -> tuple[Decision, ScaleState]:
    """The target count (job slots) for `current`, and the policy's new memory.

    `load` None means Redis did not answer: hold the current count.
    `completions_per_s` is the fleet's job completion rate over the last interval.
    """
    if load is None:
        return Decision(clamp(current, cfg), current, "no load reading: holding"), state
    growth = smoothed_growth(state.growth, state.last, load, cfg.drain_target)
    # Sized for a wait (the target, or DEFAULT_WAIT), with the pooled rate (also for the jobs being done).
    rate = pooled_rate(state)
    completions = completions_per_s if rate is None else load.running * rate
    span = cfg.max_wait if cfg.max_wait is not None else DEFAULT_ARRIVAL_SPAN
    arrival = smoothed_arrival(state.arrival, state.last, load, completions, span)
    raw = waiting_need(load, arrival, rate, cfg)
    demand = math.ceil(raw - 1e-9)
    need = clamp(demand, cfg)
    delay = down_delay(cfg)
    since = load.at - delay
    recent = (*((at, n) for at, n in state.recent if at >= since), (load.at, raw))
    state = replace(state, last=load, growth=growth, recent=recent, arrival=arrival)

    late = load.backlog > 0 and load.oldest_age > sizing_wait(cfg)
    if late:  # a job already waits past the target, whatever the formula says: one more worker
        demand = max(demand, current + 1)
        need = clamp(max(need, current + 1), cfg)
    if need >= current:
        state = replace(state, low_since=None)
        reason = "scale up" if need > current else "steady"
        waited = f", oldest job waited {load.oldest_age:.1f} s ({wait_name(cfg)})" if late else ""
        return Decision(
            need,
            need,
            f"{reason}: backlog {load.backlog}, running {load.running}, growth {growth:+.1f}/s{waited}",
            demand,
        ), state

    # need < current: only after it has stayed so for the whole scale-down delay, and then
    # to the highest need of that delay plus as much as the need varied within it (noise),
    # and only by a real step (DOWN_STEP), so a noisy load does not bounce; a load that is
    # gone varies by nothing and goes all the way down. The variation leaves this
    # observation out, so that a larger backlog never gives a lower count.
    low_since = state.low_since if state.low_since is not None else load.at
    state = replace(state, low_since=low_since)
    waited = load.at - low_since
    hold = clamp(current, cfg)
    if waited < delay:
        return Decision(
            hold,
            need,
            f"need {need}: holding {hold} for {delay - waited:.0f} s more before scaling down",
            demand,
        ), state
    earlier = [n for _, n in recent[:-1]] or [raw]
    # With a wait target the queue absorbs the noise (and a late job adds a worker): no headroom.
    noise = max(earlier) - min(earlier) if cfg.max_wait is None else 0.0
    peak = max(raw, *earlier)
    target = clamp(min(current, math.ceil(peak + noise - 1e-9)), cfg)
    spread = f"need {min(earlier):.1f} to {peak:.1f} over the last {delay:.0f} s"
    if target < hold and (noise == 0 or hold - target >= max(2, math.ceil(DOWN_STEP * hold))):
        return Decision(target, need, f"scale down: {spread}", demand), state
    return Decision(hold, need, f"need {need}: holding {hold}, {spread}", demand), state


def pick_idle_to_stop(states: dict[int, WorkerState], excess: int) -> list[int]:
    """Which slots to stop for `excess` fewer workers: idle ones only, highest slot first.

    Never a busy worker: a scale-down must not interrupt a job, so it may take longer
    than one interval to shrink if the fleet is busy.
    """
    if excess <= 0:
        return []
    idle = sorted((slot for slot, state in states.items() if state == WorkerState.IDLE), reverse=True)
    return idle[:excess]
