"""Example jobs for trying herder: `scripts/run` enqueues a burst of them."""

from __future__ import annotations

import random
import time


def resize_image(name: str, seconds: float = 0.5) -> str:
    """Pretend work: takes a while, prints like real code does (to the log, not the protocol)."""
    time.sleep(seconds)
    print(f"resized {name}")
    return f"{name}: 640x480"


def flaky(name: str) -> str:
    """Fails one time in five, as jobs behind a bad connection do."""
    if random.random() < 0.2:
        raise ConnectionError(f"{name}: upstream closed the connection")
    return name
