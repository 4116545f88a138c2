"""A worker process that runs several jobs at once, one per thread (`threads = N`).

Each thread is an RQ worker of its own: its own name (`<host>.<slot>.<pid>.t<i>`), connection,
registration, heartbeat, lease and started-job registry entry, so RQ's view (`rq info`,
rq-dashboard, `get_current_job()`, callbacks, results) stays true. What only the process can
do stays in the main thread: signals (herder's SIGTERM still ends the process at once, and the
master requeues every job it held), and the channel's watch on the master (a `stop` asks every
thread to finish its job; a changed parent pid too). A job's timeout is RQ's TimerDeathPenalty,
raised in the job's own thread (RQ's SIGALRM works only in the main thread); herder's kill past
the grace still takes the whole process. docs/operations.md, "Threads", says when to use it.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import threading
import traceback
from typing import TYPE_CHECKING

from rq.timeouts import TimerDeathPenalty

from herder.common import worker_protocol as wp
from herder.common.redis_connect import bound_calls
from herder.common.rq_names import rq_worker_name
from herder.worker.channel import Channel, ThreadChannel
from herder.worker.factory import make_worker

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis import Redis

    from herder.common.config import Config
    from herder.worker.rq_worker import HerderMixin


def run_threads(
    cfg: Config,
    channel: Channel,
    connect: Callable[[], tuple[Redis, Redis]],
    wait_for_redis: Callable[[Redis, Channel], bool],
    log_format: str,
) -> int:
    """Build cfg.threads RQ workers, run each in a thread of its own until the process is asked
    to stop, then say `stop` for the process. `connect()` gives a worker's RQ connection and
    the probe that waits for Redis; 1 if a thread's worker failed (its traceback is logged)."""
    host, slot, pid = socket.gethostname(), os.environ.get(wp.ENV_SLOT, "0"), os.getpid()
    workers: list[HerderMixin] = []
    for index in range(cfg.threads):
        connection, probe = connect()
        if not wait_for_redis(probe, channel):
            channel.stopped()
            return 0
        probe.close()
        w = make_worker(cfg, rq_worker_name(host, slot, pid, index), connection)
        w.attach(ThreadChannel(channel, index, cfg.threads), cfg.lease_seconds)  # type: ignore[arg-type]
        w.death_penalty_class = TimerDeathPenalty  # SIGALRM reaches only the main thread
        bound_calls(w.connection, max(cfg.redis_timeout, math.ceil(cfg.heartbeat_interval) + 1))
        workers.append(w)
    workers[0].nice_when_ready = cfg.worker_nice  # the process's niceness, once
    # herder's signals mean "now" for the whole process (presence.py, _install_signal_handlers).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    failed: list[int] = []

    def run(index: int, w: HerderMixin) -> None:
        w.thread_ident = threading.get_ident()
        try:
            w.work(
                logging_level=cfg.log_level.upper(),
                log_format=log_format,
                dequeue_strategy=cfg.dequeue_strategy,
            )
        except BaseException:
            failed.append(index)
            print(
                f"herder worker: thread {index} failed:\n{traceback.format_exc()}",
                file=sys.stderr,
                flush=True,
            )
            channel.request_stop(f"thread {index} failed")  # the others finish their jobs

    threads = [
        threading.Thread(target=run, args=(i, w), name=f"herder-job-{i}", daemon=True)
        for i, w in enumerate(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.stopped()
    return 1 if failed else 0
