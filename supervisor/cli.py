"""The `herder` command line.

`herder run` resolves and validates the configuration here, in the click process,
then replaces itself (exec) with the watchdog: the pid a service manager started
stays the watchdog's, which is what systemd's Type=notify and KillMode=mixed need.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from supervisor import __version__, control
from supervisor import status as status_mod
from supervisor.config import ENV_RESOLVED, EX_CONFIG, Config, ConfigError, parse_worker_command
from watchdog.provenance import exit_if_shadowed


def default_state_dir() -> str:
    if os.geteuid() == 0:
        return "/run/herder"
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return os.path.join(base, f"herder-{os.getuid()}")


def prepare_state_dir(path: str) -> str:
    """The state dir holds the control socket and logs: 0700, ours, not a symlink."""
    p = Path(path).absolute()
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = p.lstat()
    if p.is_symlink() or st.st_uid != os.geteuid():
        raise ConfigError("state_dir", f"{p} must be a directory owned by uid {os.geteuid()}, not a symlink")
    if st.st_mode & 0o077:
        os.chmod(p, 0o700)
    return str(p)


def _option(name: str, *dest: str, **kw):
    """A `herder run` flag that can also come from HERDER_<NAME> in the environment."""
    env = "HERDER_" + name.lstrip("-").replace("-", "_").upper()
    return click.option(name, *dest, envvar=env, show_envvar=True, **kw)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="herder")
def cli() -> None:
    """herder: keeps a fleet of RQ workers alive, right-sized and honest."""


@cli.command()
@_option("--redis-url", help="Redis URL, e.g. redis://:password@host:6379/0.")
@_option("--queue", "queues", multiple=True, help="Queue to work on (repeatable), in priority order.")
@_option("--workers", type=int, default=2, show_default=True, help="Number of workers (fixed).")
@_option("--min-workers", type=int, help="Autoscale: never fewer workers than this.  [default: 1]")
@_option("--max-workers", type=int, help="Autoscale between --min-workers and this (turns autoscaling on).")
@_option(
    "--scale-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between load readings (one Redis round trip each).",
)
@_option(
    "--scale-down-delay",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds the load must stay low before workers are stopped.",
)
@_option(
    "--drain-target",
    type=float,
    default=30.0,
    show_default=True,
    help="Size the fleet to empty the backlog within this many seconds.",
)
@_option("--host-id", help="This host's name in a cluster.  [default: hostname:pid]")
@_option(
    "--cluster-max-workers", type=int, help="Cap on the workers of all hosts sharing this Redis together."
)
@_option(
    "--host-ttl",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds after which a silent host is forgotten and its share taken over.",
)
@_option(
    "--job-timeout",
    type=float,
    default=180.0,
    show_default=True,
    help="Seconds a job may run when it does not set its own timeout.",
)
@_option(
    "--job-timeout-grace",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds past its timeout before herder kills a job's worker.",
)
@_option(
    "--heartbeat-interval",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between a worker's heartbeat lines.",
)
@_option(
    "--heartbeat-timeout",
    type=float,
    default=10.0,
    show_default=True,
    help="Seconds of worker silence before it is killed as unresponsive.",
)
@_option(
    "--start-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds a new worker has to say `ready`.",
)
@_option(
    "--stop-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds a stopping worker has to finish its job before it is killed.",
)
@_option(
    "--kill-timeout", type=float, default=5.0, show_default=True, help="Seconds from SIGTERM to SIGKILL."
)
@_option(
    "--max-requeues",
    type=int,
    default=3,
    show_default=True,
    help="Times a job whose worker died is requeued before it is failed.",
)
@_option(
    "--min-uptime",
    type=float,
    default=1.0,
    show_default=True,
    help="A worker exiting sooner than this after spawning died young: its slot backs off.",
)
@_option(
    "--master-heartbeat-timeout",
    type=float,
    default=15.0,
    show_default=True,
    help="Seconds of master silence before the watchdog restarts it.",
)
@_option(
    "--max-restarts",
    type=int,
    default=5,
    show_default=True,
    help="Master restarts allowed within --restart-window before the watchdog gives up.",
)
@_option("--restart-window", type=float, default=60.0, show_default=True, help="Seconds.")
@_option("--path", "paths", multiple=True, help="Directory to import job modules from (repeatable).")
@_option("--worker-command", help="Run this program as the worker instead (it must speak docs/protocol.md).")
@_option(
    "--state-dir",
    help="Directory for herder's state (0700).  [default: /run/herder as root, "
    "else $XDG_RUNTIME_DIR/herder-UID]",
)
@_option("--log-level", default="INFO", show_default=True)
@click.pass_context
def run(ctx: click.Context, **opts) -> None:
    """Run herder in the foreground (what a service unit's ExecStart calls)."""
    exit_if_shadowed()
    sources = {
        key: "command line" if src == ParameterSource.COMMANDLINE else "environment"
        for key in opts
        if (src := ctx.get_parameter_source(key))
        in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    }
    try:
        cfg = build_config(opts)
        if "workers" in sources and cfg.max_workers is not None:
            raise ConfigError(
                "workers", "a fixed count conflicts with max_workers (autoscaling)", sources["workers"]
            )
        cfg.validate(sources)
        if cfg.redis_url is None:
            raise ConfigError("redis_url", "not set: pass --redis-url or set HERDER_REDIS_URL")
        cfg.state_dir = prepare_state_dir(cfg.state_dir)
    except ConfigError as exc:
        if exc.source == "command line" and exc.key == "workers":
            raise click.BadParameter(str(exc), param_hint="--workers") from None
        click.echo(f"herder: {exc}", err=True)
        sys.exit(EX_CONFIG)
    env = dict(os.environ)
    env[ENV_RESOLVED] = cfg.to_env()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-P", "-m", "watchdog"], env)


def state_dir_option(f):
    return click.option(
        "--state-dir",
        envvar="HERDER_STATE_DIR",
        show_envvar=True,
        help="The state dir of the herder to talk to (as given to `herder run`).",
    )(f)


def ask(state_dir: str | None, body: dict) -> dict:
    """One request to the running herder; exit 4 (like supervisorctl) if it cannot be reached."""
    path = state_dir or default_state_dir()
    try:
        reply = control.call(path, body)
    except (OSError, ValueError) as exc:
        click.echo(f"herder: no herder answering at {path} ({exc.__class__.__name__}: {exc})", err=True)
        sys.exit(status_mod.EXIT_UNREACHABLE)
    if not reply.get("ok"):
        click.echo(f"herder: {reply.get('error', 'request failed')}", err=True)
        sys.exit(1)
    return reply


@cli.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
def status(state_dir: str | None, as_json: bool, watch: bool) -> None:
    """Show the fleet. Exit 0: all running; 3: something is not; 4: herder not reachable."""
    while True:
        reply = ask(state_dir, {"cmd": "status"})
        if as_json:
            click.echo(json.dumps(reply, indent=2, default=str))
        else:
            if watch:
                click.clear()
            click.echo(status_mod.render(reply))
        if not watch:
            sys.exit(status_mod.exit_code(reply))
        time.sleep(1.0)


@cli.command()
@state_dir_option
@click.argument("workers", type=click.IntRange(min=1), required=False)
@click.option("--min", "min_workers", type=click.IntRange(min=0), help="Autoscaling: new minimum.")
@click.option("--max", "max_workers", type=click.IntRange(min=1), help="Autoscaling: new maximum.")
def scale(
    state_dir: str | None, workers: int | None, min_workers: int | None, max_workers: int | None
) -> None:
    """Set the number of workers (N), or the autoscaling bounds (--min/--max)."""
    if workers is None and min_workers is None and max_workers is None:
        raise click.UsageError("give a worker count N, or --min and/or --max")
    if workers is not None and (min_workers is not None or max_workers is not None):
        raise click.UsageError("give either N or --min/--max, not both")
    body: dict = {"cmd": "scale"}
    if workers is not None:
        body["workers"] = workers
    if min_workers is not None:
        body["min"] = min_workers
    if max_workers is not None:
        body["max"] = max_workers
    reply = ask(state_dir, body)
    click.echo(f"desired {reply['desired']} workers (min {reply['min']}, max {reply['max']})")


@cli.command()
@state_dir_option
@click.option("--timeout", type=click.FloatRange(min=0), help="Seconds each worker gets to finish its job.")
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for herder to exit.")
def stop(state_dir: str | None, timeout: float | None, no_wait: bool) -> None:
    """Stop herder gracefully: every running job finishes (up to the stop timeout)."""
    body: dict = {"cmd": "stop"}
    if timeout is not None:
        body["timeout"] = timeout
    path = state_dir or default_state_dir()
    reply = ask(path, body)
    click.echo(f"stopping {reply['stopping']} workers")
    if no_wait:
        return
    while True:
        try:
            control.call(path, {"cmd": "ping"}, timeout=2)
        except (OSError, ValueError):
            click.echo("stopped")
            return
        time.sleep(0.2)


def build_config(opts: dict) -> Config:
    cfg = Config()
    for key, value in opts.items():
        if value is None or value == ():
            continue
        if key == "worker_command":
            value = parse_worker_command(value)
        elif key in ("queues", "paths"):
            value = [item for v in value for item in v.split(",") if item] if key == "queues" else list(value)
        setattr(cfg, key, value)
    cfg.state_dir = cfg.state_dir or default_state_dir()
    return cfg


def main() -> None:
    cli(prog_name="herder")


if __name__ == "__main__":
    main()
