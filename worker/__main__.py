"""Entry point: python -P -m worker --queue Q [--queue Q2] [--path DIR] ...

The Redis URL comes from the environment (HERDER_REDIS_URL), never from argv, so a
password cannot be read from the process list.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker")
    p.add_argument("--queue", action="append", dest="queues", default=[])
    p.add_argument("--path", action="append", dest="paths", default=[])
    p.add_argument("--name")
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--orphan-log")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def wait_for_redis(connection, channel) -> bool:
    """Wait until Redis answers, heartbeating meanwhile; False if asked to stop first.

    A worker started during a Redis outage waits instead of exiting, so the fleet keeps
    its size instead of churning through crash-and-respawn. A wrong password or another
    configuration error is not an outage: it raises, and the worker exits.
    """
    from redis.exceptions import AuthenticationError, ConnectionError, TimeoutError

    logged = False
    while True:
        try:
            connection.ping()
            if logged:
                print("herder worker: Redis answers, starting", file=sys.stderr, flush=True)
            return True
        except AuthenticationError:
            raise
        except (ConnectionError, TimeoutError) as exc:
            if not logged:
                print(f"herder worker: waiting for Redis ({exc})", file=sys.stderr, flush=True)
                logged = True
        if channel.stop_reason:
            return False
        channel.idle()
        time.sleep(channel.heartbeat_interval)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # The channel goes first: from here on fd 1 is stderr and only the channel
    # writes protocol lines.
    from herder.worker.channel import Channel

    channel = Channel(heartbeat_interval=args.heartbeat_interval, orphan_log=args.orphan_log)
    channel.start()
    # Job modules are imported after herder's own packages, so a user module named
    # like one of ours cannot replace it (and is reported if it tries).
    for path in reversed(args.paths):
        sys.path.insert(0, os.path.abspath(path))

    from redis import Redis

    from herder.worker.rq_worker import HerderWorker

    url = os.environ.get("HERDER_REDIS_URL", "redis://127.0.0.1:6379/0")
    connection = Redis.from_url(url)
    if not wait_for_redis(connection, channel):
        channel.stopped()
        return 0
    slot = os.environ.get("HERDER_SLOT", "0")
    name = args.name or f"herder.{socket.gethostname()}.{slot}.{os.getpid()}"
    w = HerderWorker(args.queues or ["default"], name=name, connection=connection)
    w.attach(channel)
    w.work(logging_level=args.log_level, log_format="%(levelname)s %(message)s")
    channel.stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
