"""The autoscaling policy: a pure function from what was observed to a worker count.

No I/O and no clock of its own, so it is unit- and property-tested directly
(tests/test_scaling_policy.py); docs/scaling.md explains the formula.

    need = running + ceil( (arrival_rate * T + backlog) / (rate_per_worker * T) )

where T is the drain target: enough workers for the jobs already running, plus enough
to absorb what arrives *and* empty the current backlog within T seconds. Before the
per-worker rate is known (cold start) every waiting job counts as one worker's worth,
which errs towards draining fast. With a latency target (`max_wait`) T is at most that
target, and a waiting job older than it adds a worker whatever the formula says.

Up at once; down only after `need` has stayed below the current count for the whole
scale-down delay, and then only to the highest need of that delay plus as much headroom
as the need varied within it, and by a real step (DOWN_STEP), so a noisy load does not
flap: a load that is truly gone varies by nothing and goes all the way down.
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


@dataclass(frozen=True)
class ScaleConfig:
    """The policy's settings. It counts JOB SLOTS (a worker runs `threads` jobs at once): its
    floor and ceiling are the pool's (Config's floor and ceiling, in workers) times threads,
    and with a cluster cap the ceiling is the whole cluster's; the autoscaler turns its target
    back into this host's workers (herder.supervisor.policy.autoscaler)."""

    floor: int  # job slots
    ceiling: int  # job slots
    scale_down_delay: float = 30.0
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
    return replace(state, per_worker=rate)


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
    raw = unrounded_need(load, growth, state.per_worker, completions_per_s, cfg)
    demand = math.ceil(raw - 1e-9)
    need = clamp(demand, cfg)
    since = load.at - cfg.scale_down_delay
    recent = (*((at, n) for at, n in state.recent if at >= since), (load.at, raw))
    state = replace(state, last=load, growth=growth, recent=recent)

    late = cfg.max_wait is not None and load.backlog > 0 and load.oldest_age > cfg.max_wait
    if late:  # a job already waits past the target, whatever the formula says: one more worker
        demand = max(demand, current + 1)
        need = clamp(max(need, current + 1), cfg)
    if need >= current:
        state = replace(state, low_since=None)
        reason = "scale up" if need > current else "steady"
        waited = f", oldest job waited {load.oldest_age:.1f} s (max wait {cfg.max_wait:g} s)" if late else ""
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
    if waited < cfg.scale_down_delay:
        return Decision(
            hold,
            need,
            f"need {need}: holding {hold} for {cfg.scale_down_delay - waited:.0f} s more before scaling down",
            demand,
        ), state
    earlier = [n for _, n in recent[:-1]] or [raw]
    noise = max(earlier) - min(earlier)
    peak = max(raw, *earlier)
    target = clamp(min(current, math.ceil(peak + noise - 1e-9)), cfg)
    spread = f"need {min(earlier):.1f} to {peak:.1f} over the last {cfg.scale_down_delay:.0f} s"
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
