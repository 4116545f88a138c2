"""Entry point: python -P -m herder.watchdog [-- MASTER_ARGV...]

Settings come from the resolved Config that `herder run` hands over on a descriptor
(herder.common.handover; the schema in herder.common.config, standard library only); the
master command defaults to herder's own.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

from herder.common import handover, jsonlog, statelock
from herder.common.config import Config, ConfigError
from herder.common.exits import EX_CONFIG, EX_TEMPFAIL
from herder.watchdog.core import Watchdog

if TYPE_CHECKING:
    from herder.watchdog.embedded_redis import EmbeddedRedis


def main(argv: list[str]) -> int:
    try:
        cfg = Config.handed_over()
    except ConfigError:
        print("herder watchdog: start herder with `herder run`", file=sys.stderr)
        return EX_CONFIG
    jsonlog.setup(
        cfg.log_level,
        cfg.log_format,
        "watchdog",
        "%(asctime)s herder-watchdog[%(process)d] %(levelname)s %(message)s",
    )
    if cfg.state_dir:
        try:
            hold_state_dir(cfg.state_dir)
        except statelock.Locked as exc:
            logging.error("%s", exc)
            return EX_TEMPFAIL
        except OSError as exc:
            logging.error("cannot lock the state dir: %s", exc)
            return EX_CONFIG
    master = [sys.executable, "-P", "-m", "herder.supervisor"]
    dog = Watchdog(
        argv[argv.index("--") + 1 :] if "--" in argv else master,
        heartbeat_timeout=cfg.master_heartbeat_timeout,
        max_restarts=cfg.max_restarts,
        restart_window=cfg.restart_window,
        stop_grace=cfg.drain_seconds + 10.0,
        ping_grace=3 * cfg.heartbeat_interval,
        redis=embedded_redis(cfg.state_dir) if cfg.embedded_redis else None,
        user=cfg.user,
        config=handover.receive(),
    )
    return dog.run()


def embedded_redis(state_dir: str) -> EmbeddedRedis:
    """Imported only when asked for: the watchdog starts without shutil, bz2 and lzma."""
    from herder.watchdog.embedded_redis import EmbeddedRedis

    return EmbeddedRedis(state_dir)


def hold_state_dir(state_dir: str) -> int:
    """The state dir's lock, held for the watchdog's life: the one `herder run` took and
    handed over through the exec, or (started some other way) taken here."""
    fd = statelock.adopt(os.environ.pop(statelock.ENV_LOCK_FD, ""), state_dir)
    return fd if fd is not None else statelock.acquire(state_dir)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
