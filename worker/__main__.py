"""Entry point: python -P -m herder.worker, started by the master.

Everything comes from the master (herder.supervisor.children.launcher): the resolved Config on a
descriptor or in its fork request (herder.common.handover), as for the watchdog and the
master, and the worker's slot in the environment. Neither argv nor the environment holds
the Redis password: the process list and a job's code cannot read it there.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis import Redis

    from herder.common.config import Config


def connections(cfg: Config) -> tuple[Redis, Redis]:
    """RQ's connection and the probe that waits for Redis at the start (not connected yet)."""
    from herder.common.redis_connect import connect, retry_resets
    from herder.common.rq_names import client_name

    # RQ's own calls (its dequeue, its bookkeeping on RQ's path): one whose connection broke or
    # went silent is tried again on a new connection, rather than a finished job failed for it.
    # Named, every connection: a request from the master wakes the one blocked in a dequeue.
    connection = connect(cfg.redis_url, client_name=client_name(), **retry_resets(timeouts=True))
    beat = max(0.5, cfg.heartbeat_interval)  # each ping answers or gives up within a beat
    return connection, connect(cfg.redis_url, socket_timeout=beat, socket_connect_timeout=beat)


_ahead: list = []  # [the config's JSON, RQ's connection, the probe]: made by prepare_ahead()


def prepare_ahead() -> None:
    """In a spare (herder.worker.template), before it is asked for: both connections made and
    connected for the config it inherited, which is its request's unless a pool's differs. A
    replacement then starts without a millisecond of setting them up, nor two handshakes.
    Anything amiss (Redis away, a config it cannot read) leaves it all to main()."""
    from herder.common import handover, rq_seam
    from herder.common.config import Config
    from herder.worker import reach

    try:
        cfg = Config.handed_over()
        if not cfg.redis_url:
            return
        connection, probe = connections(cfg)
        target = reach.Target.of(probe)
        if target.host:  # a resolver that does not answer must not hold the spare from its request
            reach.resolver.resolve(target.host, target.port, max(0.5, cfg.heartbeat_interval))
        probe.ping()  # within a beat, or it raises
        pool = connection.connection_pool
        pool.release(rq_seam.pool_connection(pool))
    except Exception:
        return
    _ahead[:] = [handover.receive(), connection, probe]


def made_ahead() -> tuple[Redis, Redis] | None:
    """The connections prepare_ahead() made, if they were made for this worker's config."""
    from herder.common import handover

    if not _ahead or _ahead[0] != handover.receive():
        return None
    return _ahead[1], _ahead[2]


def main() -> int:
    from herder.common import worker_protocol as wp
    from herder.common.config import Config
    from herder.common.rq_names import rq_worker_name

    cfg = Config.handed_over()
    # The channel goes first: from here on fd 1 is stderr and only the channel
    # writes protocol lines.
    from herder.worker.channel import Channel

    channel = Channel(
        heartbeat_interval=cfg.heartbeat_interval,
        orphan_log=cfg.orphan_log,
        jobs_limit=wp.jobs_limit(os.environ),  # drawn by the master, jitter and all
        wait_bound=cfg.progress_timeout,
    )
    channel.start()
    # Job modules are imported after herder's own packages, so a user module named
    # like one of ours cannot replace it.
    for path in reversed(cfg.paths):
        sys.path.insert(0, os.path.abspath(path))

    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from herder.common.redis_connect import bound_calls
    from herder.worker import hooks
    from herder.worker.factory import make_worker
    from herder.worker.reach import wait_for_redis
    from herder.worker.rq_worker import log_to_master

    try:  # the user's start-up code: a failure is this worker's failed start (the slot backs off)
        hooks.django_after_fork(cfg)
        hooks.run_worker_init(cfg)
    except Exception:
        import traceback

        what = f"--worker-init {cfg.worker_init}" if cfg.worker_init else "django.setup()"
        print(f"herder worker: start-up hook failed ({what}):\n{traceback.format_exc()}", file=sys.stderr)
        return 1

    if not cfg.redis_url:
        print("herder worker: no Redis URL configured", file=sys.stderr)
        return 1
    if cfg.threads > 1:  # several RQ workers in this process, one per thread (threads.py)
        from herder.worker.threads import run_threads

        made = [made_ahead()]  # the spare's connections serve the first thread

        def connect() -> tuple[Redis, Redis]:
            return (made.pop() if made else None) or connections(cfg)

        log_to_master("%(levelname)s %(message)s")
        return run_threads(cfg, channel, connect, wait_for_redis, "%(levelname)s %(message)s")
    connection, probe = made_ahead() or connections(cfg)
    if not wait_for_redis(probe, channel):
        channel.stopped()
        return 0
    name = rq_worker_name(socket.gethostname(), os.environ.get(wp.ENV_SLOT, "0"), os.getpid())

    while True:  # RQ's worker names itself to Redis as it is made: Redis may go between
        try:
            w = make_worker(cfg, name, connection)
            break
        except (RedisConnectionError, RedisTimeoutError):
            if not wait_for_redis(probe, channel):
                channel.stopped()
                return 0
    probe.close()
    w.attach(channel, cfg.lease_seconds)
    # Below the master once registered (an increment on its niceness: it must see deaths and
    # hangs at once while every worker is busy); at the master's own until then, so that a
    # replacement is listed by RQ in milliseconds even among busy workers.
    w.nice_when_ready = cfg.worker_nice
    # After RQ raised it to minutes for its own dequeue; a slice of herder's blocking dequeue is
    # a heartbeat interval (whole seconds before Redis 6), and a call may wait that and more.
    bound_calls(w.connection, max(cfg.redis_timeout, math.ceil(cfg.heartbeat_interval) + 1))
    log_format = "%(levelname)s %(message)s"
    log_to_master(log_format)
    w.work(
        logging_level=cfg.log_level.upper(),
        log_format=log_format,
        dequeue_strategy=cfg.dequeue_strategy,
    )
    channel.stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
