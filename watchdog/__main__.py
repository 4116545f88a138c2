"""Entry point: python -P -m herder.watchdog [-- MASTER_ARGV...]

Settings come from the resolved Config that `herder run` puts in the environment (the
schema in herder.common.config, standard library only); the master command defaults to
herder's own.
"""

from __future__ import annotations

import logging
import sys

from herder.common.config import Config, ConfigError
from herder.common.exits import EX_CONFIG
from herder.watchdog.core import Watchdog
from herder.watchdog.embedded_redis import EmbeddedRedis


def main(argv: list[str]) -> int:
    try:
        cfg = Config.from_env()
    except ConfigError:
        print("herder watchdog: start herder with `herder run`", file=sys.stderr)
        return EX_CONFIG
    logging.basicConfig(
        stream=sys.stderr,
        level=cfg.log_level.upper(),
        format="%(asctime)s herder-watchdog[%(process)d] %(levelname)s %(message)s",
    )
    master = [sys.executable, "-P", "-m", "herder.supervisor"]
    dog = Watchdog(
        argv[argv.index("--") + 1 :] if "--" in argv else master,
        heartbeat_timeout=cfg.master_heartbeat_timeout,
        max_restarts=cfg.max_restarts,
        restart_window=cfg.restart_window,
        stop_grace=cfg.drain_seconds + 10.0,
        ping_grace=3 * cfg.heartbeat_interval,
        redis=EmbeddedRedis(cfg.state_dir) if cfg.embedded_redis else None,
        user=cfg.user,
    )
    return dog.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
