"""One supervised child's life, the same for a fleet worker (master.py) and RQ's scheduler
process (scheduler.py): spawned into a slot, asked to stop, killed (SIGTERM, then SIGKILL
once), reaped (EXITED, graceful or not, and the slot's backoff). Each change of state goes
through states.change_state; what an exit means beyond that (requeues, counters, events,
the journal; the scheduler's locks) stays with the caller.

Not the fork server's template (forkserver.Template): it is asked to stop by closing its
socket, not with `stop`; it is SIGKILLed at once or after RETIRE_GRACE, never SIGTERMed; it
says nothing on stdout (no `ready`, no heartbeats for liveness to judge); and its backoff
counts failed templates in a row, with retired ones still exiting beside the new one, not a
slot's deaths young.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from herder.common.config import Config
from herder.common.exits import describe
from herder.supervisor.children.fleet import ProcessHandle, Slot, Worker, died_young
from herder.supervisor.children.observations import Observations
from herder.supervisor.children.states import KillKind, KillStage, WorkerState, change_kill, change_state
from herder.supervisor.policy.liveness import derived_state

log = logging.getLogger("herder")


def start(
    slot: Slot, cfg: Config, now: float, spawn: Callable[[], ProcessHandle], what: str
) -> ProcessHandle | None:
    """`spawn()`, or None and the slot backs off if it cannot (`what`: the log line's
    start, `slot 3: cannot spawn worker`)."""
    try:
        return spawn()
    except OSError as exc:
        delay = slot.died_young(now, cfg)
        log.error("%s (%s); next try in %.2f s", what, exc, delay)
        return None


def ask_stop(w: Worker, why: str, now: float) -> None:
    """STOPPING: `stop` on its stdin; it finishes its job and exits 0 (liveness.judge gives it
    stop_timeout). The first reason asked is the one its exit says."""
    w.life.stop_reason = w.life.stop_reason or why
    change_state(w, WorkerState.STOPPING, why)
    w.proc.send_stop()
    w.life.stop_sent_at = now


def kill(w: Worker, reason: str, kind: KillKind, now: float) -> None:
    """KILLING: SIGTERM to its process group now, SIGKILL after kill_timeout (escalate)."""
    change_state(w, WorkerState.KILLING, f"SIGTERM to its process group: {reason}", logging.WARNING)
    change_kill(w, KillStage.TERM)
    w.life.kill_reason, w.life.kill_kind, w.life.kill_started_at = reason, kind, now
    w.proc.signal_group(signal.SIGTERM)
    w.proc.signal_group(signal.SIGCONT)  # a stopped process cannot act on SIGTERM


def escalate(w: Worker, now: float, kill_timeout: float) -> None:
    """A child being killed and still alive kill_timeout after its SIGTERM: SIGKILL, once."""
    due = now - (w.life.kill_started_at or now) >= kill_timeout
    if w.life.kill_stage == KillStage.TERM and due:
        log.warning("%s: still alive %.1f s after SIGTERM: SIGKILL", w.label, kill_timeout)
        w.proc.signal_group(signal.SIGKILL)
        change_kill(w, KillStage.SIGKILLED)


def graceful(w: Worker, code: int, obs: Observations) -> bool:
    """The one rule of a graceful exit: asked to stop (by herder, or by RQ's shutdown command:
    it said `stop`), exited 0, and not killed by herder."""
    return code == 0 and not w.killed and (w.life.stop_sent_at is not None or obs.said_stop)


@dataclass(frozen=True)
class Exit:
    """What a reap found."""

    code: int  # as Popen's returncode: negative for a signal
    obs: Observations  # its last words
    lived: float  # seconds since its spawn
    graceful: bool

    @property
    def how(self) -> str:
        """`exit code 1`, `killed by SIGKILL`."""
        return describe(self.code)


def reap(w: Worker, now: float) -> Exit:
    """An exited child's exit code and last observations (it must have exited)."""
    code = w.proc.reap()
    obs = w.proc.snapshot()
    return Exit(code, obs, now - w.spawned_at, graceful(w, code, obs))


def exited(w: Worker, ex: Exit, reason: str, level: int | None = None) -> None:
    """EXITED, final: logged once with `reason` (INFO if graceful, else WARNING, unless `level`)."""
    if level is None:
        level = logging.INFO if ex.graceful else logging.WARNING
    # What its last lines said first (a job begun since the loop's last pass, a second at most
    # ago on a settled fleet's tick): the exit line says `busy -> exited` for a death mid-job.
    change_state(w, derived_state(w, ex.obs), "its last lines")
    change_state(w, WorkerState.EXITED, reason, level)


def back_off(slot: Slot, ex: Exit, cfg: Config, now: float) -> float | None:
    """The slot after its child's exit: it spawns again at once (None), or, its child having
    died young, backs off (the delay)."""
    if not died_young(ex.graceful, ex.obs.ready, ex.lived, cfg):
        slot.lived(now)
        return None
    return slot.died_young(now, cfg)
