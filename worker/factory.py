"""Which worker this process runs: the class `rq worker` would build from the same options
(docs/migrating-from-rq.md) with herder's protocol mixed in, or herder's fast one (RQ's per-job
writes in one round trip, worker/fast_path/) where the options and the rq in use allow it.

Apart from rq_worker.py so that neither it nor the fast path imports the other's user.
"""

from __future__ import annotations

import sys

from redis import Redis
from rq.serializers import resolve_serializer
from rq.utils import import_attribute
from rq.worker import BaseWorker, SimpleWorker

from herder.common import rq_seam
from herder.common.config import Config
from herder.worker.rq_worker import HerderMixin, HerderWorker, herder_worker_class

_fast_path_off: list[str | None] = []  # why the fast path cannot run here, found once per process


def fast_path_unavailable() -> str | None:
    """Why this rq and redis-py cannot take the fast path (rq_seam's check), or None. Found and
    logged once: in the fork server, whose verdict its forked workers inherit, or in a worker
    spawned on its own."""
    if not _fast_path_off:
        why = rq_seam.fast_path_missing()
        if why:
            print(
                f"herder worker: fast path off on {rq_seam.describe()}: {why}; jobs take RQ's own path",
                file=sys.stderr,
            )
        _fast_path_off.append(why)
    return _fast_path_off[0]


def fast_path_chosen(cfg: Config) -> bool:
    """Whether this process runs the fast path: asked for, RQ's own classes and dequeue, and an
    rq and redis-py it runs on."""
    fast = cfg.fast_path and not (cfg.worker_class or cfg.queue_class) and cfg.dequeue_strategy == "default"
    return fast and fast_path_unavailable() is None


def worker_class(cfg: Config) -> type[BaseWorker]:
    """The class this process builds for `cfg`: herder's fast worker where fast_path_chosen, else
    RQ's class (SimpleWorker, or the user's) with herder's protocol mixed in, RQ's own code path
    call by call. scripts/rq_suite runs RQ's own tests against the class it returns."""
    if fast_path_chosen(cfg):
        from herder.worker.fast_path.worker import HerderFastWorker  # RQ's writes in one round trip

        return HerderFastWorker
    return herder_worker_class(import_attribute(cfg.worker_class) if cfg.worker_class else SimpleWorker)


def make_worker(cfg: Config, name: str, connection: Redis) -> HerderMixin:
    """The worker `rq worker` would build from the same options (docs/migrating-from-rq.md)."""
    cls, fast = worker_class(cfg), fast_path_chosen(cfg)
    options: dict = {"name": name, "connection": connection}
    if cfg.job_class:
        options["job_class"] = import_attribute(cfg.job_class)
    if cfg.queue_class:
        options["queue_class"] = import_attribute(cfg.queue_class)
    if cfg.serializer:
        options["serializer"] = resolve_serializer(cfg.serializer)
    if cfg.exception_handlers:
        options["exception_handlers"] = [import_attribute(h) for h in cfg.exception_handlers]
    if cfg.disable_default_exception_handler:
        options["disable_default_exception_handler"] = True
    if cfg.results_ttl is not None:
        options["default_result_ttl"] = cfg.results_ttl
    if cfg.worker_ttl is not None:
        options["worker_ttl"] = cfg.worker_ttl
    if cfg.maintenance_interval is not None:
        options["maintenance_interval"] = cfg.maintenance_interval
    worker = cls(cfg.queues, **options)
    why = rq_seam.worker_missing(worker, fast=True) if fast else None
    if why:  # the rq in use builds its worker without a name the fast path reads
        print(f"herder worker: fast path off on {rq_seam.describe()}: {why}", file=sys.stderr)
        worker = HerderWorker(cfg.queues, **options)
    why = rq_seam.worker_missing(worker)
    if why:  # stop requests and endings would fail on it: said at once, not found by a job
        print(f"herder worker: on {rq_seam.describe()}: {why}", file=sys.stderr)
    return worker  # type: ignore[return-value]  # RQ makes the Queues
