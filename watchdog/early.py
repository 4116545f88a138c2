"""The master, started as the watchdog's very first act (the launch's critical path), when
`herder run` did not start one before it loaded click (herder.common.config.prestart does,
the usual case).

`herder run` execs the watchdog, which would import its own modules (logging, the config's
schema, its loop) before it starts the master; the master's interpreter then starts only
after them. Started from here, with the standard library's os, json and subprocess alone, the
master loads while the watchdog does; the watchdog adopts it once its loop is set up
(`Watchdog.adopt_master`) and watches it from its first line, as it watches every master.

Only the plain case starts early: a master that must first drop to another user, or wait for
the embedded redis-server, is started by the watchdog's loop as before. The master unblocks
the stop signals `herder run` blocked across its exec (supervisor/__main__.py), as the
watchdog does its own once its handlers are in place.
"""

from __future__ import annotations

import json
import os
import subprocess

from herder.common.handover import ENV_CONFIG_FD
from herder.common.statelock import ENV_LOCK_FD
from herder.common.uplink_protocol import MASTER_RESTARTS_ENV


def master_argv(argv: list[str], executable: str) -> list[str]:
    """The master's command: what follows `--`, or herder's own master."""
    return argv[argv.index("--") + 1 :] if "--" in argv else [executable, "-P", "-m", "herder.supervisor"]


def handed_settings(fd_text: str | None) -> dict | None:
    """The config `herder run` handed over, read without consuming it (pread: the watchdog
    reads its own copy later), or None."""
    if not fd_text:
        return None
    try:
        fd, chunks, offset = int(fd_text), [], 0
        while chunk := os.pread(fd, 1 << 16, offset):
            chunks.append(chunk)
            offset += len(chunk)
        settings = json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None
    return settings if isinstance(settings, dict) else None


def start_master_early(argv: list[str], executable: str) -> subprocess.Popen[bytes] | None:
    """The master, started now (its Popen, for the watchdog to adopt), or None where the
    watchdog's loop must start it: no config handed over, a user to run it as, or an
    embedded Redis to start first."""
    fd_text = os.environ.get(ENV_CONFIG_FD)
    settings = handed_settings(fd_text)
    if settings is None or settings.get("embedded_redis") or (settings.get("user") and os.geteuid() == 0):
        return None
    assert fd_text is not None
    env = {k: v for k, v in os.environ.items() if k != ENV_LOCK_FD}  # the lock stays the watchdog's
    env[MASTER_RESTARTS_ENV] = "0"
    return subprocess.Popen(
        master_argv(argv, executable),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        close_fds=True,
        pass_fds=(int(fd_text),),  # the master reads the same config (its own descriptor)
        # Own process group: a Ctrl-C at the terminal reaches only the watchdog, which forwards it.
        process_group=0,
        env=env,
    )
