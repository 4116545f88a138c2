"""A pool: one fleet inside the master, with its own settings (a whole Config, from
herder.common.config.pools), target, autoscaler, recycling and culling, generation (a
rolling restart of this pool only) and pause. A pool holds its workers and the slots they
run in; the host's fleet is the union of its pools' (`Workers`). The master's loop runs every
pool; the workers limit, the kill budget and the loop itself are the host's. With no
`[pools.*]` in the file there is one pool, `default`, and herder behaves as it always did.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from herder.common.config import Config
from herder.common.transitions import move
from herder.supervisor.children.fleet import Slot, Worker
from herder.supervisor.children.states import LEAVING, WORKING, Retire, WorkerState
from herder.supervisor.policy.autoscaler import Autoscaler
from herder.supervisor.policy.retirement import Retirement, working_to_its_limit
from herder.supervisor.policy.scaling import pick_idle_to_stop
from herder.supervisor.redis_side.recovery import Recovery

if TYPE_CHECKING:
    from herder.supervisor.children.launcher import Launcher

log = logging.getLogger("herder")

# A pool's worker bounds: what `herder scale` may set over the file's values.
BOUND_KEYS = ("workers", "min_workers", "max_workers")


class PoolState(StrEnum):
    """ACTIVE <--pause/resume--> PAUSED; either --a reload removes it--> DRAINING (final: its
    workers finish their jobs and stop, then the master drops it)."""

    ACTIVE = "active"
    PAUSED = "paused"  # `herder pause [--pool]`: its workers take no new jobs
    DRAINING = "draining"


POOL_TRANSITIONS: dict[PoolState, frozenset[PoolState]] = {
    PoolState.ACTIVE: frozenset({PoolState.PAUSED, PoolState.DRAINING}),
    PoolState.PAUSED: frozenset({PoolState.ACTIVE, PoolState.DRAINING}),
    PoolState.DRAINING: frozenset(),
}


@dataclass(frozen=True)
class Share:
    """What the host grants a pool for one pass (the master works it out over every pool)."""

    target: int  # the workers it keeps: its target within its share of the workers limit
    limit: int  # the host's workers limit
    host_workers: int  # the host's worker processes now, every pool's, stopping ones too


@dataclass(frozen=True)
class Stop:
    """A worker the plan sends `stop` (it finishes its job), and why."""

    worker: Worker
    why: str
    said: tuple[str, str] | None = None  # (kind, sentence) for the journal; None: no event of its own
    culled: bool = False  # announced as `worker_culled` too


@dataclass(frozen=True)
class Plan:
    """What a pool decided for one pass. The master carries it out in this order: `retire`
    (told to take no more jobs), `stops`, then up to `spawn` new workers into free slots."""

    retire: tuple[Worker, ...] = ()
    stops: tuple[Stop, ...] = ()
    spawn: int = 0
    rolling: bool = False  # workers of an older generation or marked to retire are being replaced
    # It told idle workers from busy ones (a scale-down stops idle ones only; a rolling step
    # stops idle old ones first): a worker moving between the two may change the next plan.
    by_idleness: bool = False

    @property
    def still(self) -> bool:
        """Nothing to do, and nothing but a change would give the next plan anything to do."""
        return not (self.retire or self.stops or self.spawn or self.rolling)


@dataclass
class Pool:
    """One fleet's state. Its settings in force (`cfg`) are one owner's: the file's and flags'
    (`configured`, which a reload replaces) with the operator's `herder scale` over their
    bounds (`scaled`); everything else reads `cfg`, and only `configure` and `scale` change it."""

    name: str
    cfg: Config  # in force: `configured` with `scaled` over it
    scaler: Autoscaler
    retirement: Retirement
    target: int
    configured: Config  # as the file and flags say (a reload's new values land here)
    scaled: dict[str, int] = field(default_factory=dict)  # `herder scale`'s bounds, {}: none
    generation: int = 0  # bumped by a rolling restart of this pool
    state: PoolState = PoolState.ACTIVE  # changed only through change_state
    # Where its workers come from (the master hands it over at its first spawn): a restart
    # renews it, so new workers load new code.
    launcher: Launcher | None = None
    # Its worker processes by slot, those on their way out too (a worker joins at its spawn and
    # leaves at its reap), and the slots it holds: those its workers run in, and those backing
    # off after their workers died young (a crash loop is its pool's). A slot index is one
    # pool's at a time (free_slots).
    workers: dict[int, Worker] = field(default_factory=dict)
    slots: dict[int, Slot] = field(default_factory=dict)
    by_pid: dict[int, Worker] = field(default_factory=dict)  # the same workers, by pid
    # Moved by every change its plan reads of its workers: one joining or leaving, a state the
    # master sees change (murder, a stop). A still plan (nothing to do) is not made again while
    # neither this nor the pool's own inputs moved (`plan_key`): a pass costs what changed.
    version: int = 0
    still_at: tuple[object, ...] | None = None  # the inputs of the last plan, when it was still
    by_idleness: bool = True  # the last plan told idle workers from busy ones (Plan.by_idleness)

    def touch(self) -> None:
        self.version += 1

    def planned(self, key: tuple[object, ...], plan: Plan) -> None:
        """The master made `plan` from the inputs `key` (plan_key)."""
        self.still_at = key if plan.still else None
        self.by_idleness = plan.by_idleness

    def worker_moved(self, was: WorkerState, now: WorkerState) -> None:
        """One of its workers changed state (the master saw it: murder.py). The plan is made
        afresh, but for a move between idle and busy when the last plan did not tell the two
        apart (a pool at its target, nothing to roll): a busy fleet's passes plan no pool."""
        if was in WORKING and now in WORKING and not self.by_idleness:
            return
        self.touch()

    def admit(self, w: Worker) -> None:
        """A worker joins at its spawn (spawner.py)."""
        self.workers[w.slot] = w
        self.by_pid[w.pid] = w
        self.touch()

    def leave(self, w: Worker) -> None:
        """A worker leaves at its reap (reaper.py)."""
        del self.workers[w.slot]
        self.by_pid.pop(w.pid, None)
        self.touch()

    def plan_key(self, share: Share) -> tuple[object, ...]:
        """Everything a plan reads but the clock: what would make a still plan move."""
        marks = sum(self.retirement.recycled.values())  # a worker marked to retire or culled
        return (
            share,
            self.version,
            self.generation,
            self.state,
            self.target,
            self.scaler.grant,
            marks,
            id(self.cfg),
        )

    @property
    def paused(self) -> bool:
        return self.state == PoolState.PAUSED

    @property
    def draining(self) -> bool:
        return self.state == PoolState.DRAINING

    def change_state(self, new: PoolState) -> None:
        """The one place a pool's state changes, checked against POOL_TRANSITIONS."""
        if new != self.state:
            self.state = move(POOL_TRANSITIONS, self.state, new, f"pool {self.name}")

    @classmethod
    def build(
        cls, name: str, cfg: Config, host_id: str, recovery: Recovery | None, tickets: Iterator[int]
    ) -> Pool:
        """`tickets`: the master's cull-ticket numbers, unique across its pools."""
        retirement = Retirement(cfg, recovery, tickets=tickets)
        return cls(name, cfg, Autoscaler(cfg, host_id), retirement, cfg.floor, configured=cfg)

    def configure(self, cfg: Config) -> None:
        """The file's settings anew (a reload). `herder scale`'s bounds stay over them unless the
        file changed the bounds itself: then the file's are in force again."""
        if self.scaled and any(getattr(cfg, k) != getattr(self.configured, k) for k in BOUND_KEYS):
            log.info(
                "pool %s: the file's new worker bounds replace herder scale's %s", self.name, self.scaled
            )
            self.scaled = {}
        self.configured = cfg
        self._apply(replace(cfg, **self.scaled))

    # ---- what an operator asks of a pool (commands.py translates each request) ----

    def restart(self) -> None:
        """A rolling restart: every worker of an older generation is replaced (its plan's rolling step),
        by new workers from a renewed launcher."""
        self.generation += 1
        if self.launcher is not None:
            self.launcher.renew(self.cfg)

    def pause(self, paused: bool) -> bool:
        """`herder pause` / `resume`: every worker of the pool is told (again, if the pool was
        already so); True if that changed the pool."""
        for w in self.workers.values():
            w.proc.send_pause(paused)
        if self.paused == paused:
            return False
        self.change_state(PoolState.PAUSED if paused else PoolState.ACTIVE)
        return True

    def scale(self, bounds: dict[str, int]) -> None:
        """`herder scale`: new bounds over the file's (workers, or min_workers and max_workers)."""
        self.scaled = {k: v for k, v in bounds.items() if k in BOUND_KEYS}
        self._apply(replace(self.configured, **self.scaled))

    def _apply(self, cfg: Config) -> None:
        """The target moves into the new bounds at once; autoscaling turned on starts from the
        count running so far."""
        self.target = cfg.bound(self.target) if cfg.autoscale else cfg.workers
        self.scaler.configure(cfg)
        self.cfg = cfg

    # ---- its workers ----

    def live(self) -> list[Worker]:
        """Its workers that count towards its target: not on their way out."""
        return live(self.workers.values())

    def free_slots(self, others: Iterable[Pool], room: int, limit: int, now: float) -> Iterator[Slot]:
        """Up to `room` free slots to spawn into, lowest first, among the `limit` a host may fill
        (with at most `limit` workers, one of those is free whenever there is room). A slot of
        its own in backoff takes its place without being spawned into: a crash loop cannot
        spill over. A free slot another pool left (not backing off) becomes this pool's, afresh;
        one another pool holds backing off stays that pool's."""
        rest = [p for p in others if p is not self]
        for i in range(limit):
            if room <= 0:
                return
            if i in self.workers or any(i in p.workers for p in rest):
                continue
            slot = self.slots.get(i)
            if slot is None:
                held = next((p for p in rest if i in p.slots), None)
                if held is not None and held.slots[i].in_backoff(now):
                    continue  # another pool's, backing off
                if held is not None:
                    del held.slots[i]
                slot = self.slots[i] = Slot(i)
            room -= 1
            if not slot.in_backoff(now):
                yield slot

    # ---- its decisions ----

    def plan(self, share: Share, now: float) -> Plan:
        """What the pool does this pass (`now`: wall time), pure as scaling.decide: a culled
        worker goes (its replacement starts below); a draining pool's workers finish their jobs
        and go; one past max_memory takes no more jobs. Then towards `share.target`: a rolling
        step (replacing older generations and retiring workers), or scale down idle workers,
        or room to spawn (within the cluster's grant)."""
        retire: list[Worker] = []
        stops: list[Stop] = []
        live = self.live()
        for w in live:
            if w.culled:  # every job it takes fails: no capacity to keep
                why = w.limits.retire_reason
                stops.append(Stop(w, why, ("culled", f"{w.label} {why}"), culled=True))
            elif self.draining:  # a reload removed the pool: finish the job, then go
                stops.append(Stop(w, f"pool {self.name} removed by a reload"))
            elif w.limits.retire == Retire.MAX_MEMORY and not w.limits.retire_sent:
                # Each job it takes may leak more: none from now on. Replaced, then sent `stop` (_roll).
                retire.append(w)
        if self.draining:
            return Plan(tuple(retire), tuple(stops))
        live = [w for w in live if not w.culled]  # stopped above
        target = share.target
        old = [w for w in live if w.generation < self.generation or w.retiring]
        if old:
            return self._roll(share, live, old, now, Plan(tuple(retire), tuple(stops)))
        if len(live) > target:
            states = {w.slot: w.life.state for w in live}
            for slot in pick_idle_to_stop(states, len(live) - target):
                stops.append(Stop(self.workers[slot], f"scale down to {target}"))
            return Plan(tuple(retire), tuple(stops), by_idleness=True)
        # A cluster grant counts every process still running, stopping ones included.
        room = target - len(live)
        if self.scaler.grant is not None:
            room = min(room, self.scaler.grant - len(self.workers))
        return Plan(tuple(retire), tuple(stops), max(0, room))

    def _roll(self, share: Share, live: list[Worker], old: list[Worker], now: float, plan: Plan) -> Plan:
        """One step of a rolling restart, or of retiring workers (recycled or culled), `old`
        being those of an older generation or marked to retire.

        Replacements start first, up to a batch beyond the target; an old worker is sent
        `stop` (it finishes its job) only once a new one is ready to take its place, so
        capacity never dips. If replacements keep failing, the old workers keep working. One
        replaced ahead of its jobs limit works on to the limit (retirement.working_to_its_limit).
        """
        target, stops = share.target, list(plan.stops)
        mine = list(self.workers.values())  # stopping ones too
        new = [w for w in live if w not in old]
        ready_new = [w for w in new if w.life.state in (WorkerState.IDLE, WorkerState.BUSY)]
        surplus = len(old) + len(ready_new) - target
        going = [  # one replaced ahead of its jobs limit works on to it (it stops there itself)
            w for w in old
            if w.generation < self.generation or not working_to_its_limit(w, w.proc.snapshot(), now)
        ]  # fmt: skip
        leaving = sorted(going, key=lambda w: w.life.state != WorkerState.IDLE)[: max(0, surplus)]
        for w in leaving:
            said = ("recycled", f"{w.label} {w.limits.retire_reason}; replaced") if w.recycling else None
            stops.append(Stop(w, w.limits.retire_reason or "rolling restart: replaced", said))
        batch = max(1, target // 4)
        room = min(target - len(new), target + batch - len(mine))
        settled = len(live) == len(mine) and len(ready_new) == len(new)
        if room > 0 and settled and share.host_workers >= share.limit:
            # No replacement can start first at the workers limit: one idle old worker makes room.
            idle = [w for w in old if w.life.state == WorkerState.IDLE and all(w is not x for x in leaving)]
            for w in idle[:1]:
                stops.append(Stop(w, "rolling restart at the workers limit: making room"))
        return Plan(plan.retire, tuple(stops), max(0, room), rolling=True, by_idleness=True)

    @property
    def launch_key(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Pools that agree on these share a fork server (what its template imports)."""
        return tuple(self.cfg.paths), tuple(self.cfg.preload)


# ---- the host's figures over its pools (the loop and the snapshot's builder read these) ----


def active(pools: Iterable[Pool]) -> list[Pool]:
    """The pools that run: not draining away after a reload removed them."""
    return [p for p in pools if not p.draining]


def host_target(pools: Iterable[Pool]) -> int:
    """The workers this host keeps: every running pool's target."""
    return sum(p.target for p in active(pools))


def host_floor(pools: Iterable[Pool]) -> int:
    """The fewest workers this host runs: every running pool's minimum."""
    return sum(p.cfg.floor for p in active(pools))


def live(workers: Iterable[Worker]) -> list[Worker]:
    """Workers that count towards a target (not on their way out)."""
    return [w for w in workers if w.life.state not in LEAVING]


class Workers:
    """The host's fleet: every pool's workers, by slot (a slot runs one worker, of one pool).
    A view, read-only: a worker joins and leaves its pool (`Pool.workers`), nothing else."""

    __slots__ = ("_pools",)

    def __init__(self, pools: Mapping[str, Pool]) -> None:
        self._pools = pools  # the master's, changed in place by a reload

    def values(self) -> list[Worker]:
        return [w for p in list(self._pools.values()) for w in p.workers.values()]

    def by_pid(self, pid: int) -> Worker | None:
        """A worker by its pid, in the pool that holds it (O(pools), not O(workers))."""
        for p in list(self._pools.values()):
            if (w := p.by_pid.get(pid)) is not None:
                return w
        return None

    def items(self) -> list[tuple[int, Worker]]:
        return [(i, w) for p in list(self._pools.values()) for i, w in p.workers.items()]

    def get(self, slot: int) -> Worker | None:
        for p in self._pools.values():
            w = p.workers.get(slot)
            if w is not None:
                return w
        return None

    def __getitem__(self, slot: int) -> Worker:
        w = self.get(slot)
        if w is None:
            raise KeyError(slot)
        return w

    def __contains__(self, slot: object) -> bool:
        return any(slot in p.workers for p in self._pools.values())

    def __iter__(self) -> Iterator[int]:
        return iter([i for p in list(self._pools.values()) for i in p.workers])

    def __len__(self) -> int:
        return sum(len(p.workers) for p in self._pools.values())


def slots_of(pools: Iterable[Pool]) -> dict[int, Slot]:
    """Every pool's slots, by index (an index is one pool's at a time)."""
    return {i: s for p in pools for i, s in p.slots.items()}


def share_limit(wants: list[tuple[str, int, int]], limit: int) -> dict[str, int]:
    """How many workers each pool may run under the host's workers limit (its share). `wants`:
    (pool, floor, target). Each pool gets its floor first (the config guarantees the floors fit),
    then what is left goes one worker at a time, in turn, to the pools that want more, so a
    surge in one pool never starves another below its minimum nor takes all the room."""
    caps = {name: min(floor, target) for name, floor, target in wants}
    left = limit - sum(caps.values())
    hungry = [name for name, _, target in wants if target > caps[name]]
    targets = {name: target for name, _, target in wants}
    while left > 0 and hungry:
        for name in list(hungry):
            if left <= 0:
                break
            caps[name] += 1
            left -= 1
            if caps[name] >= targets[name]:
                hungry.remove(name)
    return caps


def fleet_ready(pools: Iterable[Pool]) -> bool:
    """In every pool, every worker wanted (within the cluster's grant, after a first load
    reading when autoscaling) is up and has said `ready`."""
    for pool in pools:
        if pool.draining:
            continue
        up, grant = pool.live(), pool.scaler.grant
        due = pool.target if grant is None else min(pool.target, grant)  # the count to be ready
        if (pool.cfg.autoscale and not pool.scaler.has_reading) or len(up) < due:
            return False
        if any(w.life.state == WorkerState.STARTING for w in up):
            return False
    return True


def pool_of_queue(pools: Mapping[str, Pool], queue: str) -> str:
    """The pool that serves `queue` (a queue belongs to one pool), or "" for none."""
    return next((p.name for p in list(pools.values()) if queue in p.cfg.queues), "")
