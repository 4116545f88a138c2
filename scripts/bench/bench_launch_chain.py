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

Each worker is forked as herder's template forks one (herder.worker.template.fork_worker) and
runs herder's worker with the environment a master gives slot N (HERDER_LAUNCH_ENV, JSON, from
the bench), its stdin a pipe kept open and its protocol lines dropped. Every real step that
sits between these interpreters in herder (the configuration handed over, the master's loop
and its Redis side, a fork request) is left out, so what this measures is a lower bound for
that process tree, not something to ship.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ENV_LAUNCH = "HERDER_LAUNCH_ENV"  # {"workers": N, "env": {...}}: what each worker gets
ENV_ROLE = "HERDER_LAUNCH_ROLE"
ROLE_ARGV = [sys.executable, "-P", os.path.abspath(__file__)]


def fork_workers() -> None:
    """Import what herder's workers need, fork them the template's own way (its double fork,
    handing each worker to this process's master, a subreaper), and wait to be killed."""
    import signal

    from herder.common.prctl import become_subreaper
    from herder.worker.template import fork_worker, preload

    preload([], [])
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the middle processes, as in the template
    spec = json.loads(os.environ[ENV_LAUNCH])
    master = os.getppid() if os.environ.get(ENV_ROLE) == "template" else os.getpid()
    if master == os.getpid():
        become_subreaper()  # "single": this process is the workers' master too
    keep = []
    devnull = os.open(os.devnull, os.O_WRONLY)
    for slot in range(spec["workers"]):
        stdin_r, stdin_w = os.pipe()
        keep.append(stdin_w)  # open: a worker stops on EOF
        env = dict(spec["env"], HERDER_SLOT=str(slot))
        fork_worker({"env": env, "argv": ["herder-worker"]}, [stdin_r, devnull, 2], master)
        os.close(stdin_r)
    time.sleep(3600)


def config_from_env() -> None:
    """The stand-ins carry the config in their environment (herder hands it over on a
    descriptor: herder.common.handover); parsed as herder parses what it is handed."""
    from herder.common import handover
    from herder.common.config import Config

    handover.accept(dict(os.environ))
    Config.handed_over()


def main(role: str) -> None:
    if role == "run":
        subprocess.Popen([*ROLE_ARGV, "master"])
        import herder.supervisor.ctl.cli  # noqa: F401  the CLI `herder run` loads

        config_from_env()
        watchdog = "import herder.watchdog.core, herder.common.config as c, os, time\n"
        watchdog += "import herder.common.handover as h\n"
        watchdog += "h.accept(dict(os.environ))\nc.Config.handed_over()\ntime.sleep(3600)"
        os.execv(sys.executable, [sys.executable, "-P", "-c", watchdog])
    elif role == "master":
        from herder.common.prctl import become_subreaper

        become_subreaper()  # the workers the template double-forks become this process's children
        subprocess.Popen([*ROLE_ARGV, "template"], env=dict(os.environ, **{ENV_ROLE: "template"}))
        config_from_env()
        import herder.supervisor.children.fleet  # noqa: F401
        import herder.supervisor.children.logs  # noqa: F401
        import herder.supervisor.children.states  # noqa: F401
        import herder.supervisor.children.workerproc  # noqa: F401
        import herder.supervisor.events  # noqa: F401
        import herder.supervisor.policy.liveness  # noqa: F401

        time.sleep(3600)
    elif role in ("template", "single"):
        fork_workers()
    else:
        sys.exit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1])
