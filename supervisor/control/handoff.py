"""`herder upgrade`, master A's side: it hands its workers, its state and its listening sockets
to master B, the new build's (B's side: takeover.py; the watchdog's: watchdog/upgrade.py;
docs/design.md, "Upgrading in place").

B talks to A over A's control socket, on one connection it keeps (server.py's session):

- `begin`: A's run-time state (its host id, each pool's target, `herder scale`'s bounds and
  pause), and its listening sockets, the control socket's and the HTTP port's (SCM_RIGHTS), so
  neither refuses a connection while the masters change. A's autoscaler stops here: its pools
  only shrink from now on.
- `step` (every few tens of milliseconds): B's workers, and how many of A's to stop in each
  pool; A stops them (an idle one first; each finishes its job) and answers with its own.
- the connection closes: A is done (it exits once its last worker has), or B died and A goes
  on with the workers it still has, as before.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable, Mapping
from typing import Protocol

from herder.supervisor import __version__
from herder.supervisor.children.fleet import Worker
from herder.supervisor.children.states import WorkerState
from herder.supervisor.policy.pool import Pool

log = logging.getLogger("herder")


def summary(workers: Iterable[Worker]) -> list[dict]:
    """What status shows of a master's workers during a hand-over."""
    return [{"pid": w.pid, "pool": w.pool, "slot": w.slot, "state": w.life.state.value} for w in workers]


class Handoff:
    """A's hand-over under way: how many of each pool's workers still take jobs (`keep`: its
    target from `begin` on), and what B last said of itself."""

    def __init__(self, to_pid: int, version: str, pools: Mapping[str, Pool]) -> None:
        self.to_pid, self.version = to_pid, version
        self.keep = {name: len(p.live()) for name, p in pools.items()}
        self.b_workers: list[dict] = []
        self.over = False  # B's channel closed

    def target(self, pool: Pool, target: int) -> int:
        return min(target, self.keep.get(pool.name, 0))

    def retire(self, pool: Pool, n: int, stop: StopWorker) -> int:
        """Up to `n` of the pool's workers finish their jobs and go, idle ones first."""
        done = 0
        for w in sorted(pool.live(), key=lambda w: w.life.state != WorkerState.IDLE):
            if done >= n or self.keep.get(pool.name, 0) <= 0:
                break
            stop(w, f"herder upgrade: handed over to master {self.to_pid}")
            self.keep[pool.name] -= 1
            done += 1
        return done

    def finished(self, workers: int) -> bool:
        """Every worker handed over and gone: A may exit."""
        return not any(self.keep.values()) and workers == 0


class StopWorker(Protocol):
    def __call__(self, w: Worker, why: str) -> None: ...


class TakingOver(Protocol):
    """Master B's side as status shows it (takeover.Takeover)."""

    done: bool

    def view(self) -> dict: ...


class Handing(Protocol):
    """What the hand-over asks of a master (herder.supervisor.master.Master)."""

    handoff: Handoff | None
    takeover: TakingOver | None
    host_id: str

    def pool_list(self) -> list[Pool]: ...

    def stop_worker(self, w: Worker, why: str) -> None: ...

    def listeners(self) -> list[socket.socket]: ...


def answer(m: Handing, body: dict) -> dict:
    """One request of B's channel, in A's loop."""
    op, pools = body.get("op"), {p.name: p for p in m.pool_list()}
    if op == "begin":
        if m.handoff is not None:
            return {"ok": False, "error": f"a hand-over to master {m.handoff.to_pid} is under way"}
        m.handoff = Handoff(int(body["pid"]), str(body.get("version", "")), pools)
        log.info("herder upgrade: master %d (herder %s) takes over; this master's workers go as its own are "
                 "ready", m.handoff.to_pid, m.handoff.version)  # fmt: skip
        held = m.listeners()
        return {
            "ok": True,
            "pid": os.getpid(),
            "version": __version__,
            "host_id": m.host_id,
            "pools": {
                p.name: {"target": p.target, "scaled": p.scaled, "paused": p.paused, "live": len(p.workers)}
                for p in pools.values()
            },
            "listeners": [s.family == socket.AF_UNIX and "control" or "http" for s in held],
            "_fds": [s.fileno() for s in held],
        }
    h = m.handoff
    if h is None:
        return {"ok": False, "error": "no hand-over under way"}
    if op == "end":
        h.over = True
        if not h.finished(sum(len(p.workers) for p in pools.values())) and any(h.keep.values()):
            log.warning("herder upgrade: master %d went before the hand-over finished: this master goes on "
                        "with its %d workers", h.to_pid, sum(h.keep.values()))  # fmt: skip
            m.handoff = None
        return {"ok": True}
    if op != "step":
        return {"ok": False, "error": f"unknown hand-over step {op!r}"}
    h.b_workers = list(body.get("workers", []))
    for name, n in dict(body.get("retire", {})).items():
        if name in pools and int(n) > 0:
            h.retire(pools[name], int(n), m.stop_worker)
    return {
        "ok": True,
        "live": {p.name: len(p.workers) for p in pools.values()},
        "serving": dict(h.keep),
        "workers": summary(w for p in pools.values() for w in p.workers.values()),
    }


def status(m: Handing, reply: dict) -> dict:
    """What `herder status` adds: the version and the hand-over. During one, the host is running
    when both masters' workers taking jobs (idle or busy, not told to stop) make the target."""
    handover = view(m)
    out: dict = {"version": __version__, "handover": handover}
    if handover and not reply["stopping"] and not reply["running"]:
        taking = [
            w for side in ("from", "to") for w in handover[side]["workers"] if w["state"] in ("idle", "busy")
        ]
        out["running"] = len(taking) >= reply["desired"] and not reply["slots_in_backoff"]
    return out


def view(m: Handing) -> dict | None:
    """The hand-over as `herder status` shows it, from either master: both masters, their
    versions and whose workers are whose; None when none is under way."""
    if m.takeover is not None and not m.takeover.done:
        return m.takeover.view()
    h = m.handoff
    if h is None:
        return None
    mine = summary(w for p in m.pool_list() for w in p.workers.values())
    return {
        "from": {"pid": os.getpid(), "version": __version__, "workers": mine},
        "to": {"pid": h.to_pid, "version": h.version, "workers": list(h.b_workers)},
    }
