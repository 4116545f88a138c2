"""The watchdog, set up (`python -P -m herder.watchdog [-- MASTER_ARGV...]` comes here once
__main__.py has started the master: early.py).

Settings come from the resolved Config that `herder run` hands over on a descriptor
(herder.common.handover; the schema in herder.common.config, standard library only); the
master command defaults to herder's own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from typing import TYPE_CHECKING

from herder.common import handover, jsonlog, statelock
from herder.common import upgrade_protocol as up
from herder.common.config import Config, ConfigError
from herder.common.exits import EX_CONFIG, EX_TEMPFAIL
from herder.watchdog.core import Watchdog
from herder.watchdog.early import master_argv

if TYPE_CHECKING:
    from herder.common.config.prestart import Adopted
    from herder.watchdog.embedded_redis import EmbeddedRedis


def main(argv: list[str], master: subprocess.Popen[bytes] | Adopted | None = None) -> int:
    """`master`: one already started (`herder run`'s, herder.common.config.prestart, or
    early.py's), which the watchdog adopts; ended if the watchdog cannot go on (nothing of it
    has run a job yet)."""
    try:
        cfg = Config.handed_over()
    except ConfigError:
        print("herder watchdog: start herder with `herder run`", file=sys.stderr)
        return refuse(EX_CONFIG, master)
    jsonlog.setup(
        cfg.log_level,
        cfg.log_format,
        "watchdog",
        "%(asctime)s herder-watchdog[%(process)d] %(levelname)s %(message)s",
    )
    lock_fd = None
    if cfg.state_dir:
        try:
            lock_fd = hold_state_dir(cfg.state_dir)
        except statelock.Locked as exc:
            logging.error("%s", exc)
            return refuse(EX_TEMPFAIL, master)
        except OSError as exc:
            logging.error("cannot lock the state dir: %s", exc)
            return refuse(EX_CONFIG, master)
    dog = Watchdog(
        master_argv(argv, sys.executable),
        heartbeat_timeout=cfg.master_heartbeat_timeout,
        max_restarts=cfg.max_restarts,
        restart_window=cfg.restart_window,
        stop_grace=cfg.drain_seconds + 10.0,
        ping_grace=3 * cfg.heartbeat_interval,
        redis=embedded_redis(cfg.state_dir) if cfg.embedded_redis else None,
        user=cfg.user,
        config=handover.receive(),
        state_dir=cfg.state_dir or "",
    )
    dog.upgrader.lock_fd = lock_fd
    if up.ENV_STATE in os.environ:  # exec'd by `herder upgrade` (watchdog/upgrade.py)
        dog.upgrader.resume(json.loads(os.environ.pop(up.ENV_STATE)))
    elif master is not None:
        dog.adopt_master(master, early=True)
    return dog.run()


def check_upgrade() -> int:
    """`herder upgrade`'s check of the installed code, in a child of the watchdog about to exec
    it: the watchdog's modules import, and the config file is read again by the installed code
    (what a reload cannot apply, an upgrade does), the result on stdout for the watchdog to
    run with; then the master's own check (`python -m herder.supervisor --check-upgrade`) in this
    process, with that config. Exit 0: the exec may go on."""
    import herder.watchdog.core  # noqa: F401
    import herder.watchdog.notify  # noqa: F401

    text = upgraded_config(Config.handed_over())  # ConfigError: the installed herder refuses it
    os.write(1, text.encode())
    env = dict(os.environ)
    if text is not None:
        env[handover.ENV_RESOLVED] = text
    env, fd = handover.seal(env)
    if fd is not None:
        os.set_inheritable(fd, True)
    os.execve(sys.executable, [sys.executable, "-P", "-m", "herder.supervisor", "--check-upgrade"], env)


# What a running herder cannot change under itself: where its lock, socket and Redis live, and
# whom it runs as. A file that changes one of them needs a restart.
FIXED = ("state_dir", "user", "embedded_redis")


def upgraded_config(cfg: Config) -> str:
    """The config the upgraded herder runs with: the config file read again (as a reload reads
    it: environment and flags stay pinned), or `cfg` itself without a file."""
    from dataclasses import replace

    from herder.common.config.reload import reread

    if not cfg.config_file:
        return cfg.to_json()
    # The dashboard's token `herder run` took from its environment stays.
    fresh = replace(reread(cfg), http_token=cfg.http_token)
    changed = [k for k in FIXED if getattr(fresh, k) != getattr(cfg, k)]
    if changed:
        where = f"file {cfg.config_file}"
        raise ConfigError(", ".join(changed), "cannot change in an upgrade: restart herder", where)
    return fresh.to_json()


def refuse(code: int, master: subprocess.Popen[bytes] | Adopted | None) -> int:
    """Exit `code`, and take the early master (and what it forked: its group) along."""
    if master is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(master.pid, signal.SIGKILL)
        master.wait()
    return code


def embedded_redis(state_dir: str) -> EmbeddedRedis:
    """Imported only when asked for: the watchdog starts without shutil, bz2 and lzma."""
    from herder.watchdog.embedded_redis import EmbeddedRedis

    return EmbeddedRedis(state_dir)


def hold_state_dir(state_dir: str) -> int:
    """The state dir's lock, held for the watchdog's life: the one `herder run` took and
    handed over through the exec, or (started some other way) taken here."""
    fd = statelock.adopt(os.environ.pop(statelock.ENV_LOCK_FD, ""), state_dir)
    return fd if fd is not None else statelock.acquire(state_dir)
