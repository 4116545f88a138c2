"""`herder upgrade`: what its three parties share (docs/design.md, "Upgrading in place").

- the CLI signals the watchdog (SIGUSR1) and follows the outcome in `<state dir>/upgrade.json`,
  which only the watchdog writes (atomically, by rename), each attempt under a new `seq`;
- the watchdog re-execs itself from the installed code, handing itself its state in
  ENV_STATE, and starts the new master B with ENV_FROM naming the old master A;
- B asks A, over A's control socket, for its run-time state and its listening sockets
  (SCM_RIGHTS), then tells it, slot by slot, which workers to stop.

Standard library only: the watchdog imports it.
"""

from __future__ import annotations

import json
import os
import signal

SIGNAL = signal.SIGUSR1  # to the watchdog: upgrade in place
ENV_STATE = "HERDER_UPGRADE_STATE"  # the watchdog's state across its own exec (JSON)
ENV_FROM = "HERDER_UPGRADE_FROM"  # in master B's environment: A's pid
RESULT = "upgrade.json"
SURGE = 1  # workers a pool may run beyond its max while A's and B's overlap
GATE_SECONDS = 60.0  # B's first workers ready within this, or the upgrade fails and A stays

# The states of an attempt, as upgrade.json says them; the last two are final.
CHECKING, STARTING, HANDING_OVER, DONE, FAILED = "checking", "starting", "handing over", "done", "failed"
FINAL = (DONE, FAILED)


def result_path(state_dir: str) -> str:
    return os.path.join(state_dir, RESULT)


def write_result(state_dir: str, record: dict) -> None:
    """Atomically: a reader sees the old record or the new one, never half of one."""
    path = result_path(state_dir)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def read_result(state_dir: str) -> dict:
    try:
        with open(result_path(state_dir)) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}
