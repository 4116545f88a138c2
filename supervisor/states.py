"""Worker states, decided only by the master's reconcile loop.

Reader threads record what a worker said (observations); the loop turns observations
and its own actions into one of these states and logs every transition with a reason.

    STARTING --ready--> IDLE <--busy/done--> BUSY
        |                 |                    |
        |      master sends `stop`             |
        +-------------> STOPPING <-------------+
        |                 |
   unresponsive / EOF     | `stop` line + exit 0, or stop timeout
        v                 v
     KILLING ---------> EXITED --(slot dies young)--> BACKOFF --(delay)--> STARTING

- STARTING: spawned, no `ready` yet. Deadline: start_timeout.
- IDLE: waiting for a job; must send `idle` at least every heartbeat_timeout.
- BUSY: running a job; must send `beat` lines (heartbeat_timeout) and finish within the
  job's timeout plus job_timeout_grace.
- STOPPING: the master sent `stop`; the worker finishes its job, says `stop`, exits 0.
  Deadline: stop_timeout, then KILLING.
- KILLING: SIGTERM sent to the worker's process group; SIGKILL after kill_timeout.
- EXITED: reaped. A job it still held goes back on its queue (or to the failed registry).
- BACKOFF: a slot whose workers keep dying young waits, doubling each time (capped),
  before it spawns again, so a crash loop never spins.
"""

from __future__ import annotations

from enum import StrEnum


class WorkerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    STOPPING = "stopping"
    KILLING = "killing"
    EXITED = "exited"
    BACKOFF = "backoff"
