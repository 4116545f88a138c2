"""`herder upgrade`: the running herder takes the installed code without a dip (docs/cli.md).

The CLI signals the watchdog (its pid is in the state dir's lock file; SIGUSR1, the same signal
`systemctl kill -s USR1 --kill-whom=main herder` sends) and follows the attempt in
`<state dir>/upgrade.json`, which the watchdog writes (watchdog/upgrade.py). Exits 0 once the
old master has handed every worker over and exited, 1 if the new build failed (the old master
goes on; the error is printed) or the running herder cannot upgrade in place.
"""

from __future__ import annotations

import os
import time

import click

from herder.common import processes, statelock
from herder.common import upgrade_protocol as up
from herder.supervisor.ctl import client

ANSWER_WITHIN = 5.0  # seconds for the watchdog to take the signal up (a first upgrade.json)
SAID = {
    up.CHECKING: "checking the installed herder",
    up.STARTING: "master {new} (the installed herder) starts beside master {old}",
    up.HANDING_OVER: "master {new} is ready; master {old} hands its workers over as they finish their jobs",
}


def upgrade(state_dir: str, timeout: float | None) -> int:
    pid = statelock.holder(state_dir, wait=0.5)
    if pid is None or statelock.held(state_dir) is False:
        click.echo(f"herder: no herder running at {state_dir}", err=True)
        return 4
    rec = up.read_result(state_dir)
    if rec.get("watchdog") == pid and rec.get("state") not in (None, *up.FINAL):
        click.echo(f"herder: an upgrade is under way already ({rec['state']}); wait for it to end", err=True)
        return 1
    began = time.time()
    try:
        os.kill(pid, up.SIGNAL)
    except OSError as exc:
        click.echo(f"herder: cannot signal the watchdog (pid {pid}): {exc}", err=True)
        return 1
    seq, said = None, ""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rec = up.read_result(state_dir)
        mine = rec.get("watchdog") == pid and (rec.get("seq") == seq if seq else rec.get("at", 0) >= began)
        if mine:
            seq = rec.get("seq")
            state = rec.get("state", "")
            if state != said and state in SAID:
                click.echo(SAID[state].format(old=rec.get("old", "?"), new=rec.get("new", "?")))
            said = state
            if state == up.FAILED:
                click.echo(f"herder upgrade failed: {rec.get('error', 'no reason given')}", err=True)
                return 1
            if state == up.DONE:
                break
        elif seq is None and time.time() - began > ANSWER_WITHIN:
            click.echo(
                f"herder: the watchdog (pid {pid}) did not take the upgrade up within {ANSWER_WITHIN:g} s: a "
                "herder older than `herder upgrade` ignores its signal; restart it once "
                "(`systemctl restart herder`), then upgrade in place from then on",
                err=True,
            )
            return 1
        if not processes.exists(pid) or statelock.held(state_dir) is False:  # a zombie still answers kill(0)
            click.echo(f"herder: the watchdog (pid {pid}) exited during the upgrade; see its log", err=True)
            return 1
        if deadline is not None and time.monotonic() > deadline:
            click.echo(f"herder: the upgrade is still under way ({said}) after {timeout:g} s", err=True)
            return 1
        time.sleep(0.1)
    try:
        status = client.call(state_dir, {"cmd": "status"})
        click.echo(f"upgraded: herder {status.get('version', '?')} (master {status['master']['pid']})")
    except (OSError, ValueError, KeyError):
        click.echo("upgraded")
    return 0
