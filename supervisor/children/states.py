"""Worker states and the one funnel every change goes through (supervisord's model).

Reader threads only record what a worker said (Observations); the reconcile loop turns
that and its own actions into a state here. `change_state` checks the move against
TRANSITIONS, logs it with its reason, and refuses a move the table does not allow: an
illegal transition is a bug in the loop, and says so loudly.

    STARTING --ready--> IDLE <--busy/done--> BUSY
        |                 |                    |
        |  `stop` sent (scale down, rolling restart, drain)
        +--------------> STOPPING <-----------+
        |                 |                    |
        |   unresponsive: no `ready`, silence, EOF, job or stop timeout, hurried stop
        +--------------> KILLING <-------------+   (from STARTING, IDLE, BUSY, STOPPING)
                          |
   any state --exit--> EXITED    (reaped; a job it held goes back on its queue)

- STARTING: spawned, no `ready` yet. Deadline: start_timeout (or heartbeat_timeout of
  silence once it has said `idle`).
- IDLE: waiting for a job; must send `idle` at least every heartbeat_timeout.
- BUSY: running a job; must send `beat` lines (heartbeat_timeout) and finish within the
  job's timeout plus job_timeout_grace.
- STOPPING: the master sent `stop`; the worker finishes its job, says `stop`, exits 0.
  Deadline: stop_timeout, then KILLING.
- KILLING: SIGTERM sent to the worker's process group; SIGKILL after kill_timeout.
- EXITED: reaped. Final.

Backoff is not a worker state: it belongs to the slot (herder.supervisor.children.fleet.Slot), which
waits before it spawns again when its workers keep dying young.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Protocol

from herder.common.transitions import IllegalTransition as IllegalTransition  # re-exported
from herder.common.transitions import move

log = logging.getLogger("herder")


class WorkerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    KILLING = "killing"
    EXITED = "exited"


S = WorkerState
TRANSITIONS: dict[WorkerState, frozenset[WorkerState]] = {
    S.STARTING: frozenset({S.IDLE, S.BUSY, S.STOPPING, S.KILLING, S.EXITED}),
    S.IDLE: frozenset({S.BUSY, S.STOPPING, S.KILLING, S.EXITED}),
    S.BUSY: frozenset({S.IDLE, S.STOPPING, S.KILLING, S.EXITED}),
    S.STOPPING: frozenset({S.KILLING, S.EXITED}),
    S.KILLING: frozenset({S.EXITED}),
    S.EXITED: frozenset(),
}
# On their way out: they no longer count towards the target.
LEAVING = frozenset({S.STOPPING, S.KILLING})
WORKING = frozenset({S.IDLE, S.BUSY})


class MasterPhase(StrEnum):
    """The master's own life: STARTING --the fleet first ready--> RUNNING --stop--> STOPPING;
    a stop may come while it starts. A started master never goes back (the watchdog replaces
    a master that failed; a new one starts again)."""

    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"


PHASES: dict[MasterPhase, frozenset[MasterPhase]] = {
    MasterPhase.STARTING: frozenset({MasterPhase.RUNNING, MasterPhase.STOPPING}),
    MasterPhase.RUNNING: frozenset({MasterPhase.STOPPING}),
    MasterPhase.STOPPING: frozenset(),
}


class Cull(StrEnum):
    """Where culling stands for a worker whose jobs keep failing (herder.supervisor.policy.retirement):

    NONE --failing, a token asked--> ASKED --granted--> CULLED (stopped as its replacement starts)
      |                                |
      +--budget spent on this host-----+--refused or no answer--> DENIED
    DENIED --asked again later--> ASKED;  DENIED --its jobs succeed again--> NONE
    """

    NONE = "none"
    ASKED = "asked"  # a token of the cluster-wide cull budget is on its way
    DENIED = "denied"  # the budget is spent: left running, asked again later
    CULLED = "culled"  # final: it retires


CULL_TRANSITIONS: dict[Cull, frozenset[Cull]] = {
    Cull.NONE: frozenset({Cull.ASKED, Cull.DENIED, Cull.CULLED}),  # CULLED: no Redis to ask
    Cull.ASKED: frozenset({Cull.CULLED, Cull.DENIED}),
    Cull.DENIED: frozenset({Cull.ASKED, Cull.NONE}),
    Cull.CULLED: frozenset(),
}


def change_cull(w: HasCull, new: Cull) -> None:
    """The one place a worker's culling moves, checked against CULL_TRANSITIONS."""
    c = w.culling
    if c.cull != new:
        c.cull = move(CULL_TRANSITIONS, c.cull, new, f"{w.label} cull")


class KillKind(StrEnum):
    """Why herder killed a worker, as a class: liveness.judge's verdicts, then the master's own.
    The values are label values (herder_kills_total, the `worker_killed` event's `kind`) and a
    given-up job's cause (herder.worker.abandoned.CAUSES): never rename one."""

    STDOUT_CLOSED = "stdout_closed"
    STOP_TIMEOUT = "stop_timeout"
    SILENT = "silent"
    NO_READY = "no_ready"
    NO_PROGRESS = "no_progress"
    JOB_TIMEOUT = "job_timeout"
    MEMORY_HARD = "memory_hard"  # over the hard memory limit (retirement.py)
    HURRIED_STOP = "hurried_stop"
    SCHEDULER = "scheduler"  # the scheduler process, whatever the verdict (scheduler.py)
    OOM = "oom"  # not herder's kill: the kernel's OOM killer's SIGKILL, counted beside them
    DIED = "died"  # no kill at all: a death herder did not ask for (a requeued job's cause)


class KillStage(StrEnum):
    """Where herder's kill of a worker stands (the KILLING state's sub-states, and the one
    before a kill the budget refused):

    NONE --judged hung, no kill token--> SPARED --responsive again--> NONE
    NONE, SPARED --SIGTERM to its group--> TERM --still alive after kill_timeout--> SIGKILLED
    """

    NONE = "none"
    SPARED = "spared"  # judged hung, but the kill budget was spent: left alone (guard.py)
    TERM = "term"  # SIGTERM sent: the worker is KILLING
    SIGKILLED = "sigkilled"  # SIGKILL sent, once: final


KILL_TRANSITIONS: dict[KillStage, frozenset[KillStage]] = {
    KillStage.NONE: frozenset({KillStage.SPARED, KillStage.TERM}),
    KillStage.SPARED: frozenset({KillStage.NONE, KillStage.TERM}),
    KillStage.TERM: frozenset({KillStage.SIGKILLED}),
    KillStage.SIGKILLED: frozenset(),
}


class Retire(StrEnum):
    """Why a worker retires (herder.supervisor.policy.retirement): a planned recycle, or a cull. The
    values are label values (herder_recycled_total's reason): never rename one."""

    MAX_JOBS = "recycled after max jobs"
    MAX_AGE = "recycled after max age"
    MAX_MEMORY = "recycled after max memory"
    CULLED = "culled"


class LifeState(Protocol):
    """The states of a worker's life record (herder.supervisor.children.fleet.Life)."""

    state: WorkerState
    kill_stage: KillStage


class CullState(Protocol):
    """The state of a worker's culling record (herder.supervisor.children.fleet.Culling)."""

    cull: Cull


class HasState(Protocol):
    """What the funnels read and change of a worker (herder.supervisor.children.fleet.Worker)."""

    @property
    def life(self) -> LifeState: ...

    @property
    def label(self) -> str: ...  # `slot 3 pid 1234`, `scheduler pid 1234`


class HasCull(Protocol):
    """What change_cull reads and changes of a worker (herder.supervisor.children.fleet.Worker)."""

    @property
    def culling(self) -> CullState: ...

    @property
    def label(self) -> str: ...


def change_kill(w: HasState, new: KillStage) -> None:
    """The one place a worker's kill stage moves, checked against KILL_TRANSITIONS."""
    life = w.life
    life.kill_stage = move(KILL_TRANSITIONS, life.kill_stage, new, f"{w.label} kill")


def change_state(w: HasState, new: WorkerState, reason: str, level: int = logging.INFO) -> None:
    """The one place a worker's state changes: checked against TRANSITIONS, and logged, once,
    with everything known about why (`level`: WARNING for a fault). No other line repeats it."""
    life = w.life
    if life.state == new:
        return
    move(TRANSITIONS, life.state, new, w.label, reason)
    if {life.state, new} <= WORKING:
        level = logging.DEBUG  # one IDLE<->BUSY flip per job: or a busy fleet's log is nothing else
    log.log(level, "%s: %s -> %s (%s)", w.label, life.state, new, reason)
    life.state = new
