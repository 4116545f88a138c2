"""Entry point: python -P -m herder.watchdog [-- MASTER_ARGV...]. The master is `herder run`'s,
started before it loaded click (herder.common.config.prestart), or else starts first here
(early.py); then the watchdog loads and adopts it (entry.py)."""

from __future__ import annotations

import os
import sys

from herder.common.config.prestart import adopt
from herder.common.upgrade_protocol import ENV_STATE


def run() -> int:
    if sys.argv[1:] == ["--check-upgrade"]:
        from herder.watchdog.entry import check_upgrade

        return check_upgrade()
    upgrading = ENV_STATE in os.environ  # exec'd by `herder upgrade`: master A runs already
    master = None if upgrading else adopt()
    if master is None and not upgrading:
        from herder.watchdog.early import start_master_early

        master = start_master_early(sys.argv[1:], sys.executable)
    from herder.watchdog.entry import main

    return main(sys.argv[1:], master)


if __name__ == "__main__":
    sys.exit(run())
