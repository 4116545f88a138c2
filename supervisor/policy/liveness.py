"""Is a worker alive and well? Pure functions of (worker, observations, clock, config).

The reconcile loop asks `judge` about each worker once per pass; a verdict is the reason
to kill it, and whether that reason is herder's own *judgement* that the worker is hung
(silence, no `ready`, a closed stdout), which a widespread fault can fool and so spends
the kill budget, or a deadline the worker itself agreed to (a job past its own timeout,
a stop past the stop timeout), which does not.
"""

from __future__ import annotations

from dataclasses import dataclass

from herder.common.config import Config
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.observations import Held, Observations
from herder.supervisor.children.states import KillKind, WorkerState

EOF_GRACE = 1.0  # seconds a worker may live on after closing its stdout


@dataclass(frozen=True)
class Verdict:
    reason: str
    judged_hung: bool  # takes a kill token (see the module doc)
    kind: KillKind  # the reason's class, a metric label: silent, no_ready, stdout_closed, ...


def derived_state(w: Worker, obs: Observations) -> WorkerState:
    """The state the worker's own lines imply, unless the master's action rules."""
    if w.life.state in (WorkerState.KILLING, WorkerState.STOPPING, WorkerState.EXITED) or not obs.ready:
        return w.life.state
    return WorkerState.BUSY if obs.jobs else WorkerState.IDLE


def past_job_timeout(obs: Observations, now: float, cfg: Config) -> tuple[float, Held] | None:
    """Seconds a job it runs is past its timeout plus grace, and that job (the furthest past,
    in a threaded worker), or None if none is."""
    worst: tuple[float, Held] | None = None
    if not obs.jobs:  # asked of every worker each pass: most of a big idle fleet runs none
        return None
    for held in obs.jobs.values():
        timeout = held.timeout if held.timeout is not None else cfg.job_timeout
        over = now - held.started - timeout
        if timeout >= 0 and over > cfg.job_timeout_grace and (worst is None or over > worst[0]):
            worst = (over, held)
    return worst


def stuck_since(obs: Observations) -> float | None:
    """Since when the loop of a thread running a job has made no progress outside the job's
    own code (the earliest, in a threaded worker), or None."""
    if not obs.jobs:
        return None
    if len(obs.jobs) == 1:  # one thread: asked of every busy worker that changed, each pass
        return next(iter(obs.jobs.values())).stuck_since
    return min((h.stuck_since for h in obs.jobs.values() if h.stuck_since is not None), default=None)


def read_late(verdict: Verdict | None, w: Worker) -> bool:
    """A silence, or a `ready` not seen, that the master's own reader explains: the worker's
    lines wait unread in its pipe (a master starved of CPU by its busy fleet reads late).
    Never a reason to kill: a replacement that started in time, its `ready` unread, is no
    hung start (a rolling restart of a CPU-bound fleet lost such workers, and their jobs)."""
    late_kinds = (KillKind.SILENT, KillKind.NO_READY)
    return verdict is not None and verdict.kind in late_kinds and w.proc.unread() > 0


def judge(w: Worker, obs: Observations, now: float, cfg: Config) -> Verdict | None:
    """Why this worker must be killed now, or None while it is fine. A kill for silence or for
    no `ready` names what the worker said it was waiting for, if it did (`wait`)."""
    verdict = _judge(w, obs, now, cfg)
    if verdict is None or obs.waiting is None or verdict.kind not in (KillKind.SILENT, KillKind.NO_READY):
        return verdict
    return Verdict(f"{verdict.reason}; it was {obs.waiting.reason(now)}", verdict.judged_hung, verdict.kind)


def next_verdict_at(w: Worker, obs: Observations, cfg: Config) -> float:
    """The earliest moment `judge` could find a verdict if neither the worker's lines nor the
    master's actions change what it sees: murder judges the worker again then, not each pass.
    Never later than the truth (tests/test_liveness_deadlines.py checks it against `judge`)."""
    if obs.stdout_eof:
        return obs.eof_at + (cfg.kill_timeout if obs.said_stop else EOF_GRACE)
    life = w.life
    stop_at = float("inf")
    if life.state == WorkerState.STOPPING and life.stop_sent_at is not None:
        stop_at = life.stop_sent_at + cfg.stop_timeout
    if not obs.ready:
        if obs.last_seen > w.spawned_at and not obs.ready_refused:
            return min(stop_at, obs.last_seen + cfg.heartbeat_timeout)
        return min(stop_at, w.spawned_at + cfg.start_timeout)
    at = min(stop_at, obs.last_seen + cfg.heartbeat_timeout)
    stuck = stuck_since(obs)
    if stuck is not None:
        at = min(at, stuck + cfg.progress_timeout)
    for held in obs.jobs.values():
        timeout = held.timeout if held.timeout is not None else cfg.job_timeout
        if timeout >= 0:
            at = min(at, held.started + timeout + cfg.job_timeout_grace)
    return at


def _judge(w: Worker, obs: Observations, now: float, cfg: Config) -> Verdict | None:
    late = past_job_timeout(obs, now, cfg)
    # A stop timeout is part of a stop, and a job past its own timeout is killed as RQ itself
    # would: neither is a judgement a widespread fault could fool.
    hung = w.life.state != WorkerState.STOPPING and late is None
    if obs.stdout_eof:
        # EOF comes a moment before the exit that caused it: allow the process time to go.
        grace = cfg.kill_timeout if obs.said_stop else EOF_GRACE
        if now - obs.eof_at > grace:
            how = " after saying stop" if obs.said_stop else " but kept running"
            return Verdict("closed its stdout" + how, judged_hung=hung, kind=KillKind.STDOUT_CLOSED)
        return None
    stopping_for = now - w.life.stop_sent_at if w.life.stop_sent_at is not None else 0.0
    if w.life.state == WorkerState.STOPPING and stopping_for > cfg.stop_timeout:
        busy = f", job {obs.job_id} still running" if obs.job_id else ""
        return Verdict(
            f"still running {cfg.stop_timeout:g} s after `stop`{busy}",
            judged_hung=False,
            kind=KillKind.STOP_TIMEOUT,
        )
    if not obs.ready:
        if obs.last_seen > w.spawned_at and not obs.ready_refused:
            # Heartbeats (`idle`, `wait`) before `ready`: alive, waiting (for Redis, say); judged
            # by silence, as a worker that cannot reach Redis is replaced by one that cannot either.
            # Not once its `ready` was refused: it will never be ready, however alive.
            silent = now - obs.last_seen
            if silent > cfg.heartbeat_timeout:
                why = f"silent for {silent:.1f} s before `ready` (limit {cfg.heartbeat_timeout:g} s)"
                return Verdict(why, judged_hung=hung, kind=KillKind.SILENT)
            return None
        if now - w.spawned_at > cfg.start_timeout:
            why = f"no `ready` within the start timeout of {cfg.start_timeout:g} s"
            if obs.ready_refused:
                why += f" (its `ready` was refused: {obs.ready_refused})"
            return Verdict(why, judged_hung=hung, kind=KillKind.NO_READY)
        return None
    silent = now - obs.last_seen
    if silent > cfg.heartbeat_timeout:
        why = f"silent for {silent:.1f} s (heartbeat timeout {cfg.heartbeat_timeout:g} s)"
        return Verdict(why, judged_hung=hung, kind=KillKind.SILENT)
    stuck = stuck_since(obs)
    if stuck is not None and now - stuck > cfg.progress_timeout:
        # Alive (its beat goes on) but its loop is stuck outside the job: a Redis call that
        # never returns, say. It will not finish what it holds; its job is recovered.
        why = (
            f"its loop made no progress for {now - stuck:.0f} s outside the job's own code "
            f"(progress timeout {cfg.progress_timeout:g} s)"
        )
        return Verdict(why, judged_hung=hung, kind=KillKind.NO_PROGRESS)
    if late is not None:
        over, held = late
        timeout = held.timeout if held.timeout is not None else cfg.job_timeout
        which = f"job {held.job_id} " if len(obs.jobs) > 1 else ""  # a threaded worker: which one
        why = f"busy {over:.0f} s past its {which}{timeout:g} s timeout"
        return Verdict(why, judged_hung=False, kind=KillKind.JOB_TIMEOUT)
    return None
