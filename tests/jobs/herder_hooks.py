"""--worker-init hooks for tests/test_worker_hooks.py."""

from __future__ import annotations

import os
import time


def record_init() -> None:
    """Appends this worker's pid to $HERDER_TEST_INIT_LOG: one line per worker start."""
    with open(os.environ["HERDER_TEST_INIT_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")


def failing_init() -> None:
    raise RuntimeError("no database today")


def slow_start() -> None:
    """A worker that takes $HERDER_TEST_SLOW_START seconds to start (a big app's imports)."""
    time.sleep(float(os.environ["HERDER_TEST_SLOW_START"]))
