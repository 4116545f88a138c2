"""Entry point: python -P -m watchdog [-- MASTER_ARGV...]

Settings come from the resolved config that `herder run` puts in the environment
(read with json, standard library only); the master command defaults to herder's own.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from herder.watchdog.core import EX_CONFIG, Watchdog
from herder.watchdog.embedded_redis import EmbeddedRedis


def main(argv: list[str]) -> int:
    raw = os.environ.get("HERDER_RESOLVED_CONFIG")
    if not raw:
        print("herder watchdog: start herder with `herder run`", file=sys.stderr)
        return EX_CONFIG
    cfg = json.loads(raw)
    logging.basicConfig(
        stream=sys.stderr,
        level=str(cfg.get("log_level", "INFO")).upper(),
        format="%(asctime)s herder-watchdog[%(process)d] %(levelname)s %(message)s",
    )
    master_argv = (
        argv[argv.index("--") + 1 :]
        if "--" in argv
        else [sys.executable, "-P", "-m", "herder.supervisor.master"]
    )
    stop_grace = float(cfg["stop_timeout"]) + float(cfg["kill_timeout"]) + 10.0
    dog = Watchdog(
        master_argv,
        heartbeat_timeout=float(cfg["master_heartbeat_timeout"]),
        max_restarts=int(cfg["max_restarts"]),
        restart_window=float(cfg["restart_window"]),
        stop_grace=stop_grace,
        ping_grace=3 * float(cfg["heartbeat_interval"]),
        redis=EmbeddedRedis(cfg["state_dir"]) if cfg.get("embedded_redis") else None,
        user=str(cfg.get("user") or ""),
    )
    return dog.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
