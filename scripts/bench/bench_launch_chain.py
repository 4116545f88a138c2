"""Stand-ins for the launch bound (bench_launch.py): herder's process tree with no step in
series but the interpreters themselves. Standard library and herder only: it runs as
`python -P bench_launch_chain.py ROLE`, ROLE one of

- `run`: stands for `herder run`. Starts the master as its first act, then loads the CLI and
  the configuration and execs a stand-in watchdog (which loads the watchdog and waits).
- `master`: starts the template as its first act, then loads the master's modules that do
  not touch Redis, and waits.
- `template`: imports what herder's workers need (herder.worker.template.preload) and forks
  the workers itself: no request from a master, no loop.
- `single`: one interpreter, rq's pool's shape: imports what herder's workers need and forks
  them; no watchdog, master or template before it.

Each forked worker runs herder's worker (herder.worker.__main__.main) with the environment a
master gives slot N (HERDER_LAUNCH_ENV, JSON, from the bench), its stdin a pipe kept open and
its protocol lines dropped. Every real step that sits between these interpreters in herder
(the configuration handed over, the master's loop and its Redis side, a fork request) is left
out, so what this measures is a lower bound for that process tree, not something to ship.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ENV_LAUNCH = "HERDER_LAUNCH_ENV"  # {"workers": N, "env": {...}}: what each worker gets
ROLE_ARGV = [sys.executable, "-P", os.path.abspath(__file__)]


def fork_workers() -> None:
    """Import what herder's workers need, fork them, and wait to be killed."""
    from herder.worker.template import preload

    preload([], [])
    spec = json.loads(os.environ[ENV_LAUNCH])
    keep = []
    for slot in range(spec["workers"]):
        stdin_r, stdin_w = os.pipe()
        keep.append(stdin_w)  # open: a worker stops on EOF
        if os.fork() == 0:
            os.dup2(stdin_r, 0)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.environ.clear()
            os.environ.update(spec["env"])
            os.environ["HERDER_SLOT"] = str(slot)
            os.environ["HERDER_PARENT_PIDS"] = str(os.getppid())
            from herder.worker.__main__ import main

            os._exit(main())
        os.close(stdin_r)
    time.sleep(3600)


def main(role: str) -> None:
    if role == "run":
        subprocess.Popen([*ROLE_ARGV, "master"])
        import herder.supervisor.ctl.cli  # noqa: F401  the CLI `herder run` loads
        from herder.common.config import Config

        Config.from_env()
        watchdog = "import herder.watchdog.core, herder.common.config as c, time\n"
        watchdog += "c.Config.from_env()\ntime.sleep(3600)"
        os.execv(sys.executable, [sys.executable, "-P", "-c", watchdog])
    elif role == "master":
        subprocess.Popen([*ROLE_ARGV, "template"])
        from herder.common.config import Config

        Config.from_env()
        import herder.supervisor.events  # noqa: F401
        import herder.supervisor.fleet  # noqa: F401
        import herder.supervisor.liveness  # noqa: F401
        import herder.supervisor.logs  # noqa: F401
        import herder.supervisor.states  # noqa: F401
        import herder.supervisor.workerproc  # noqa: F401

        time.sleep(3600)
    elif role in ("template", "single"):
        fork_workers()
    else:
        sys.exit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1])
