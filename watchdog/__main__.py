"""Entry point: python -P -m herder.watchdog [-- MASTER_ARGV...]. The master starts first
(early.py), then the watchdog loads and adopts it (entry.py)."""

from __future__ import annotations

import sys

from herder.watchdog.early import start_master_early


def run() -> int:
    master = start_master_early(sys.argv[1:], sys.executable)
    from herder.watchdog.entry import main

    return main(sys.argv[1:], master)


if __name__ == "__main__":
    sys.exit(run())
