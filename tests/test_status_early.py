"""`herder status` from the first moment: the control socket answers `starting` before the
first worker spawns, and the status keeps one shape from `starting` to `running`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import HERDER, wait_for
from herder.common import statelock
from herder.common.control_protocol import socket_path
from herder.supervisor.ctl import client

pytestmark = pytest.mark.slow

GATED = str(Path(__file__).parent / "fakeworkers" / "gated.py")


def status_now(state_dir: str) -> dict | None:
    """The status over the control socket, as `herder status --json` reads it; None while
    nobody answers."""
    try:
        return client.call(state_dir, {"cmd": "status"})
    except OSError:
        return None


def wait_state(state_dir: str, state: str, timeout: float = 20) -> dict:
    def reached() -> dict | None:
        st = status_now(state_dir)
        return st if st and st["state"] == state else None

    return wait_for(reached, timeout, what=f"status state {state}")  # type: ignore[return-value]


def status_cli(state_dir: str) -> tuple[int, dict]:
    r = subprocess.run(
        [HERDER, "status", "--json", "--state-dir", state_dir], capture_output=True, text=True, timeout=30
    )
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {})


def test_status_answers_starting_before_the_first_worker_and_running_once_ready(herder, tmp_path):
    gate = tmp_path / "gate"
    h = herder(workers="2", worker_command=f"{sys.executable} {GATED} {gate}", no_scheduler=True)
    # What a user sees right after `herder run`: it holds its state dir at once.
    wait_for(
        lambda: statelock.holder(h.state_dir, wait=0.0) == h.pid, 10, what="herder run to lock its state dir"
    )
    code, st = status_cli(h.state_dir)
    assert code == 3, f"herder status exited {code} while herder starts (4 would be 'not running')"
    assert st["state"] == "starting" and not st["running"]
    # The socket was bound before any worker was spawned: the master's own order of events
    # (its log is one stream; process start times from /proc are too coarse to compare).
    h.wait_log(r": spawned -> starting", 10)  # the first spawn, as the master logs it
    log = h.log()
    assert f"control socket {socket_path(h.state_dir)}" in log
    assert log.index("control socket ") < log.index(": spawned -> starting")
    # Workers spawned but not ready: still starting, and the full status says so.
    st = wait_for(
        lambda: (s := client.call(h.state_dir, {"cmd": "status"}))["workers"] and s, 10, what="workers"
    )
    assert st["state"] == "starting" and {w["state"] for w in st["workers"]} == {"starting"}
    gate.touch()
    running = wait_state(h.state_dir, "running")
    assert running["actual"] == 2
    code, st = status_cli(h.state_dir)
    assert code == 0 and st["state"] == "running"
    h.stop_and_check()


def test_the_starting_answer_has_the_shape_of_the_full_status(herder, tmp_path):
    from herder.common.config import Config
    from herder.supervisor.views.status import starting_status

    early = starting_status(Config(queues=["high", "default"]), started_at=0.0, version="0.2.0")
    assert [q["name"] for q in early["queues"]] == ["high", "default"]  # in force, in priority order
    h = herder(workers="1")
    full = wait_state(h.state_dir, "running")
    assert set(early) == set(full), set(early) ^ set(full)
    assert set(early["totals"]) == set(full["totals"])
    assert set(early["settings"]) <= set(full["settings"]) and early["settings"]["queues"] == [
        "high",
        "default",
    ]
    h.stop_and_check()
