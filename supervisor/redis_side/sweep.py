"""Which jobs on herder's queues does no live worker hold? A pure function of what one
sweep read from Redis and what the master knows; the recovery thread (recovery.py) reads,
calls `plan`, and moves what it returns back to the front of its queue, atomically.

Where a job can be while a worker has it, and who decides it is orphaned:

- RQ's intermediate list (`rq:queue:<q>:intermediate`): the worker popped it (LMOVE) and
  has not yet done RQ's bookkeeping. A healthy worker moves it on within milliseconds.
  Orphaned when no live worker of ours said `busy` with it (a worker of another host that
  froze right there is its own master's to kill).
- RQ's StartedJobRegistry (`rq:wip:<q>`), with the worker's name on the job (RQ adds the
  entry a moment before it writes the name). Orphaned when the worker is one of ours that
  died (we reaped it: certain), when no name was ever written (its worker died in that
  moment), or when it is a herder worker of another host whose lease is gone (its whole
  host died: the lease is re-checked inside the atomic move). Leases are trusted only once
  every live master and worker has had time to renew them (not right after this master
  starts or Redis comes back). Also when the worker is one of ours, alive, but running
  another job or none, for longer than `unknown_grace`: it does not know it holds this one
  (a failover that lost the writes after a start, so Redis has the start and not the finish).
- Every candidate must look orphaned at two sweeps at least `grace` apart before it moves:
  a worker that just popped or started a job may not have told its master yet.
- Jobs held by workers that are not herder's (a plain `rq worker` on the same queues) are
  RQ's own business: never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from herder.common.rq_names import is_herder_worker

# Job states in which a leftover intermediate-list entry is only litter (RQ leaves finished
# jobs there when a worker serves several queues): removed, never rerun.
FINISHED = frozenset({"finished", "failed", "stopped", "canceled", ""})


@dataclass(frozen=True)
class Started:
    """An entry of a StartedJobRegistry."""

    queue: str
    member: str  # "<job id>:<execution id>"
    job_id: str
    worker: str  # the job's worker_name ("" if unknown)


@dataclass(frozen=True)
class Popped:
    """An entry of an intermediate list."""

    queue: str
    job_id: str
    status: str  # the job's status ("" when the job itself is gone)


@dataclass(frozen=True)
class Fleet:
    """What this master knows of its own workers at the moment of the sweep."""

    live: frozenset[str] = frozenset()  # RQ names of its workers still running
    dead: frozenset[str] = frozenset()  # RQ names of its workers reaped recently
    held: frozenset[str] = frozenset()  # job ids its live workers said `busy` with
    holding: Mapping[str, str | None] = field(default_factory=dict)  # a live worker's job, or None


@dataclass(frozen=True)
class Recover:
    source: str  # "wip" or "intermediate"
    queue: str
    member: str  # what to remove from the source
    job_id: str
    holder: str  # the worker whose lease the move re-checks, or "" for none
    why: str
    label: str = "swept"  # the requeue's class, for the metrics: swept (found by a sweep), killed, died
    cause: str = "swept"  # why, for a given-up job's ending: a kill's kind, "died" or "swept"


def plan(
    started: list[Started],
    popped: list[Popped],
    fleet: Fleet,
    first_seen: dict[tuple[str, str, str], float],
    now: float,
    grace: float,
    trust_leases: bool,
    unknown_grace: float = 30.0,
) -> tuple[list[Recover], dict[tuple[str, str, str], float]]:
    """The jobs to move back, and the new first-seen times of the candidates.

    A candidate is moved only once it has looked orphaned for `grace` seconds (two sweeps):
    a worker that just popped or just started a job may not have told its master yet. A job
    whose holder's lease has lapsed (another host's worker, its host dead) moves at once.
    """
    candidates: list[Recover] = []
    patience: dict[tuple[str, str, str], float] = {}  # a candidate's own grace, when not `grace`
    for s in started:
        if s.job_id in fleet.held:
            continue
        if s.worker in fleet.live:  # alive: orphaned only if it runs another job (or none) for long
            other = fleet.holding.get(s.worker)
            why = f"its worker {s.worker} runs {'job ' + other if other else 'no job'}, not this one"
            candidates.append(Recover("wip", s.queue, s.member, s.job_id, "", why))
            patience[("wip", s.queue, s.member)] = unknown_grace
        elif s.worker in fleet.dead:
            candidates.append(Recover("wip", s.queue, s.member, s.job_id, "", f"its worker {s.worker} died"))
        elif not s.worker:  # started by a worker that died before it put its name on the job
            why = "started by a worker that died before it ran the job"
            candidates.append(Recover("wip", s.queue, s.member, s.job_id, "", why))
        elif trust_leases and is_herder_worker(s.worker):
            why = f"its worker {s.worker} renews no lease: its host is gone"
            candidates.append(Recover("wip", s.queue, s.member, s.job_id, s.worker, why))
    in_wip = {s.job_id for s in started}
    for p in popped:
        running = p.status not in FINISHED and p.status != "queued"  # started, or not RQ's
        if p.job_id in in_wip or p.job_id in fleet.held or running:
            continue
        if p.status in FINISHED:
            why = "left in the intermediate list after it finished"
        else:
            why = "popped by a worker that died before it started the job"
        candidates.append(Recover("intermediate", p.queue, p.job_id, p.job_id, "", why))
    seen: dict[tuple[str, str, str], float] = {}
    out = []
    for r in candidates:
        key = (r.source, r.queue, r.member)
        seen[key] = first_seen.get(key, now)
        # A lapsed lease is proof enough at once (nobody renewed it for lease_seconds, and
        # the move re-checks it inside Redis); the grace is for what this master may not
        # know yet: a job its own worker has just popped or started.
        if r.holder or now - seen[key] >= patience.get(key, grace):
            out.append(r)
    return out, seen
