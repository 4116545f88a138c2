"""A pytest plugin (`-p herder_rq_plugin`, scripts/test-rq-suite): RQ's own test suite run
against herder's worker in place of RQ's Worker and SimpleWorker.

Loaded before pytest collects rq's tests, it puts the class `herder run` builds with its
defaults (herder.worker.factory.worker_class: the fast worker on rq 3, RQ's SimpleWorker with
herder's protocol mixed in on rq 2) under every name rq's tests import a worker by: rq.Worker,
rq.SimpleWorker, rq.worker.Worker and rq.worker.SimpleWorker (and so `rq worker`'s default
class, 'rq.Worker'). Each instance is attached at construction to a stand-in for the master's
channel, as a worker with no master behind it (tests/conftest.py's unit_fast_worker does the
same in herder's own tests): it says nothing, and stops when asked (RQ's shutdown command).

The tests listed in deselected.txt (beside this file; each a test id and why) test RQ's
fork-per-job internals, which herder's worker replaces by design: they are deselected, and
counted in the summary.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import rq
import rq.worker
from rq.worker import BaseWorker

from herder.common.config import Config
from herder.worker.channel import JobsLimit, Progress
from herder.worker.factory import worker_class

LISTED = Path(__file__).with_name("deselected.txt")


class StandInChannel(Progress):
    """The master's end of a worker's channel, for a worker with no master: every line is
    dropped, and a stop request (RQ's shutdown command) ends the worker's loop as `stop` would."""

    heartbeat_interval = 1.0
    paused = False

    def __init__(self) -> None:
        self.stop_reason: str | None = None
        self.requests = threading.Event()
        self.endings: deque[str] = deque()
        self.on_beat: Callable[[], None] | None = None
        self.limit = JobsLimit()  # no jobs limit: the master hands a worker one only with max_jobs

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            self.requests.set()

    def on_request(self, wake: Callable[[], None]) -> None:
        pass  # no master sends requests

    def ready(self) -> None:
        self.progress()

    def idle(self, paused: str | None = None) -> None:
        self.progress()

    def busy(
        self, job_id: str, timeout: float | None, queue: str | None = None, func: str | None = None
    ) -> None:  # noqa: E501
        self.progress()

    def done(self, job_id: str, ok: bool | None, hold: bool = False) -> None:
        self.progress()

    def send_held(self) -> None:
        pass

    def stopped(self) -> None:
        pass


def standalone(base: type[BaseWorker]) -> type[BaseWorker]:
    """`base` attached to a StandInChannel as it is made; the same name, so RQ's messages and a
    test's report say which class ran."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.attach(StandInChannel(), lease_seconds=Config().lease_seconds)

    return type(base.__name__, (base,), {"__init__": __init__, "__module__": base.__module__})


HERDER_WORKER = standalone(worker_class(Config()))
if os.environ.get("HERDER_RQ_SUITE_WORKER") == "rq-simple":
    # The baseline: RQ's own SimpleWorker under the same names, no herder. A test that fails
    # here too tests what a fork per job does and a job in process does not.
    HERDER_WORKER = rq.worker.SimpleWorker
for module in (rq, rq.worker):
    module.Worker = module.SimpleWorker = HERDER_WORKER  # type: ignore[misc, attr-defined]


def listed() -> dict[str, str]:
    """deselected.txt: `test id # reason` a line; blank lines and lines starting `#` are comments."""
    tests = {}
    for line in LISTED.read_text().splitlines():
        test_id, _, reason = line.partition(" # ")
        if test_id.strip() and not test_id.startswith("#"):
            tests[test_id.strip()] = reason.strip()
    return tests


def worker_named() -> str:
    """The class rq's tests import as rq.Worker now: herder's, made standalone (or the baseline)."""
    worker = rq.Worker
    base = worker if worker is rq.worker.SimpleWorker else worker.__mro__[1]
    return f"{base.__module__}.{base.__name__}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for module in {getattr(item, "module", None) for item in items} - {None}:
        for name in ("Worker", "SimpleWorker"):  # imported before this plugin replaced them?
            if getattr(module, name, HERDER_WORKER) is not HERDER_WORKER:
                raise pytest.UsageError(
                    f"{module.__name__}.{name} is not herder's worker: rq's own would be tested"
                )
    tests = listed()
    keep, dropped = [], []
    for item in items:
        (dropped if item.nodeid in tests else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    config.stash[DESELECTED] = len(dropped)


DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    n = config.stash.get(DESELECTED, 0)
    terminalreporter.write_line(
        f"herder: rq.Worker and rq.SimpleWorker are {worker_named()} (rq {rq.__version__}); "
        f"{n} of rq's tests deselected as listed in {LISTED.name}"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    """Worker processes a failed test of RQ's WorkerPool leaves would hold pytest's exit
    (multiprocessing joins its children): ended here, so a failure ends the run."""
    for child in multiprocessing.active_children():
        child.kill()
