"""The `herder` command line: click's commands and options, each turning its arguments into a
request (client.py) or a start-up (startup.py) and their outcome into output and an exit code.

`herder run` resolves and validates the configuration here, in the click process, then
startup.py settles it and replaces this process (exec) with the watchdog. Its master's
interpreter started before click loaded (prestart.py, imported first), and waits for that
configuration.
"""

from __future__ import annotations

# Before anything else: `herder run`'s master starts loading (it waits for the configuration).
import herder.supervisor.ctl.prestart  # noqa: F401

# isort: split
import grp
import json
import os
import pwd
import shutil
import signal
import sys
import time
from pathlib import Path

import click
from click.core import ParameterSource

from herder.common import config as settings
from herder.common import statelock
from herder.common.config import EX_CONFIG, Config, ConfigError, OverLimit
from herder.common.config.prestart import TOKEN_ENV
from herder.common.exits import EX_TEMPFAIL
from herder.supervisor.ctl import client, render, startup, version


class LenientBool(click.types.BoolParamType):
    """A boolean flag's HERDER_* value: true/false words become bools here; anything else goes
    through as written, so config.coerce rejects it with exit 78 like any other bad value."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            return value


# install-service's own meaning of two settings: who the service runs as, where it keeps its state.
SERVICE_HELP = {
    "user": "The user the service runs as: the unit's User= (systemd) or the plist's UserName "
    "(launchd); herder, its workers and its embedded Redis run as this user. Default: the user "
    "running install-service.",
    "state_dir": "The service's state dir, 0700 (default /var/lib/herder with systemd, created by "
    "its StateDirectory=; /usr/local/var/herder with launchd).",
}


def run_options(f=None, *, helps: dict[str, str] | None = None):  # noqa: ANN001, ANN201 - a click decorator
    """The settings flags, shared by `herder run`, `herder config` and `install-service`,
    made from the Config schema: each can also come from its HERDER_* variable. Defaults
    live in Config, so an unset flag is None here. `helps` replaces a flag's help where a
    command gives the setting a meaning of its own (install-service's --user)."""
    if f is None:
        return lambda g: run_options(g, helps=helps)
    helps = helps or {}
    defaults = Config()
    for key in reversed(settings.KEYS):
        default = getattr(defaults, key)
        shown = f"  [default: {default}]" if default not in (None, "", []) and key != "state_dir" else ""
        if key == "workers_limit":
            shown = f"  [{settings.default_workers_limit()[0]} on this host]"
        flag = settings.flag_of(key)
        # A boolean is --name/--no-name; unset, it stays None like the others.
        boolean = {"type": LenientBool(), "default": None} if isinstance(default, bool) else {}
        f = click.option(
            f"{flag}/--no-{flag[2:]}" if boolean else flag,
            key,
            **boolean,
            multiple=settings.repeatable(key),
            # A number's flag shows its kind; its value stays text until config.coerce (exit 78).
            metavar=settings.metavar(key),
            envvar=settings.env_of(key),
            show_envvar=True,
            help=helps[key] if key in helps else settings.HELP[key] + shown,
        )(f)
    f = click.option(
        "--config",
        "config_file",
        envvar="HERDER_CONFIG",
        show_envvar=True,
        type=click.Path(dir_okay=False),
        help="A TOML file of settings (flags win over it).",
    )(f)
    return f


def given_settings(ctx: click.Context, opts: dict) -> dict[str, tuple[object, str]]:
    """The settings given on the command line or in HERDER_* variables, as written (a string,
    a list of them, or a bool), each with where it came from."""
    given: dict[str, tuple[object, str]] = {}
    for key, value in opts.items():
        src = ctx.get_parameter_source(key)
        if (
            key not in settings.KEYS
            or value is None
            or value == ()
            or src not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
        ):
            continue
        if src == ParameterSource.COMMANDLINE:
            flag = settings.flag_of(key)
            source = f"command line ({'--no-' + flag[2:] if value is False else flag})"
        else:
            source = f"environment ({settings.env_of(key)})"
        given[key] = (list(value) if isinstance(value, tuple) else value, source)
    return given


def resolve_settings(ctx: click.Context, opts: dict) -> tuple[Config, dict[str, str]]:
    """Defaults < file < environment < flags (herder.common.config.resolve); ConfigError on
    any bad value. This only turns click's view of the flags into the last layer."""
    layers = []
    config_file = opts.pop("config_file", None)
    if config_file:
        layers.append(settings.load_file(config_file))
    given = given_settings(ctx, opts)
    layers.append(given)
    cfg, sources = settings.resolve(layers)
    if not cfg.django_settings and os.environ.get("DJANGO_SETTINGS_MODULE"):
        given["django_settings"] = (
            os.environ["DJANGO_SETTINGS_MODULE"],
            "environment (DJANGO_SETTINGS_MODULE)",
        )
        cfg, sources = settings.resolve(layers)
    # RQ's and django-rq's settings sit just above the defaults (RQ's over Django's); reload keeps them.
    below = []
    try:
        if cfg.django_settings:
            below.append(settings.django_layer(cfg.django_settings, cfg.paths))
        if cfg.rq_config:
            below.append(settings.rq_settings_layer(cfg.rq_config, cfg.paths))
    except ConfigError as exc:  # name where the module's name came from
        if exc.source != "default":
            raise
        message = str(exc).split(": ", 1)[1]
        raise ConfigError(exc.key, message, sources.get(exc.key, "default")) from None
    from_below: list[str] = []
    if below:
        cfg, sources = settings.resolve([*below, *layers])
        from_below = [k for layer in below for k, (_, source) in layer.items() if sources.get(k) == source]
    if config_file:
        cfg.config_file = os.path.abspath(config_file)
    cfg.pinned = sorted({*given, *from_below})
    if cfg.redis_url and cfg.redis_url.startswith("redis+sentinel://"):
        from herder.common.redis_connect import parse_sentinel_url  # redis-py loads slowly: only now

        try:
            parse_sentinel_url(cfg.redis_url)
        except ValueError as exc:
            raise ConfigError("redis_url", str(exc), sources.get("redis_url", "default")) from None
    return cfg, sources


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=version.print_version,
    help="Show herder's version, and the rq, redis-py and Python it runs on, and exit.",
)
def cli() -> None:
    """herder: keeps a fleet of RQ workers alive, right-sized and honest."""


@cli.command()
@run_options
@click.pass_context
def run(ctx: click.Context, **opts) -> None:
    """Run herder in the foreground (what a service unit's ExecStart calls)."""
    try:
        cfg, sources = resolve_settings(ctx, opts)
        owner = startup.settle(cfg, sources)
    except ConfigError as exc:
        if exc.key == "workers" and exc.source.startswith("command line") and not isinstance(exc, OverLimit):
            raise click.BadParameter(str(exc), param_hint="--workers") from None
        click.echo(f"herder: {exc}", err=True)
        sys.exit(EX_CONFIG)
    try:
        lock_fd = startup.lock_state_dir(cfg.state_dir, owner)
    except statelock.Locked as exc:
        click.echo(f"herder: {exc}", err=True)
        sys.exit(EX_TEMPFAIL)
    except OSError as exc:
        click.echo(f"herder: cannot lock the state dir: {exc}", err=True)
        sys.exit(EX_CONFIG)
    startup.exec_watchdog(cfg, lock_fd)


@cli.command("install-service")
@click.argument("kind", type=click.Choice(["systemd", "launchd"]))
@click.option("--output", type=click.Path(dir_okay=False), help="Write the file here instead of to stdout.")
@click.option("--label", default="io.herder", show_default=True, help="The launchd Label.")
@run_options(helps=SERVICE_HELP)
@click.pass_context
def install_service(ctx: click.Context, kind: str, output: str | None, label: str, **opts) -> None:
    """Render a systemd unit or a launchd plist that runs this herder as a service.

    Every `herder run` option given here (or in a HERDER_* variable) goes on the service's
    `herder run` command line; --config names a file the service reads itself. A Redis URL
    with a password is refused: units are world-readable. Put it in the config file (mode
    0600) or, for systemd, HERDER_REDIS_URL=... in /etc/herder/environment.

    The service's state dir is /var/lib/herder (systemd) or /usr/local/var/herder (launchd)
    unless --state-dir names another; a bare `herder status`, `stop`, `scale`, ... looks there
    after `herder run`'s own default, so it finds the service without flags.
    """
    from herder.supervisor.ctl import service  # xml and urllib: only this command pays for them

    config_file = opts.get("config_file")
    given = {key: value for key, (value, _) in given_settings(ctx, opts).items()}
    try:
        cfg, sources = resolve_settings(ctx, opts)
        if not cfg.state_dir:  # where a bare `herder status` looks too (startup.state_dirs_to_try)
            cfg.state_dir = startup.SERVICE_STATE_DIRS[kind]
        user = cfg.user or pwd.getpwuid(os.geteuid()).pw_name
        entry = pwd.getpwnam(user)  # the unit's Group= is its primary group
    except KeyError:
        unknown = ConfigError("user", f"no such user: {user!r}", sources.get("user", "default"))
        click.echo(f"herder: {unknown}", err=True)
        sys.exit(EX_CONFIG)
    except ConfigError as exc:
        click.echo(f"herder: {exc}", err=True)
        sys.exit(EX_CONFIG)
    for key in set(given) & settings.SECRET_KEYS:
        why = service.secret_refusal(kind, key, str(given[key]), sources[key])
        if why:
            raise click.UsageError(why)
    if sources.get("django_settings", "").endswith("(DJANGO_SETTINGS_MODULE)"):
        given["django_settings"] = cfg.django_settings  # the service has no DJANGO_SETTINGS_MODULE
    from_env = [
        sources[k].removeprefix("environment (").removesuffix(")")
        for k in given
        if sources.get(k, "").startswith("environment")
    ]
    if config_file and ctx.get_parameter_source("config_file") == ParameterSource.ENVIRONMENT:
        from_env.insert(0, "HERDER_CONFIG")
    if from_env:
        click.echo(
            f"herder: note: {', '.join(from_env)} from the environment go into the service as flags",
            err=True,
        )
    if os.environ.get(TOKEN_ENV):
        click.echo(
            f"herder: warning: {TOKEN_ENV} is not written into the service file (it is a secret): "
            + (
                f"put it in {service.ENVIRONMENT_FILE} (mode 0600), or use --http-token-file"
                if kind == "systemd"
                else "use --http-token-file"
            ),
            err=True,
        )
    if user == "root":
        click.echo(
            "herder: warning: the service would run as root; pass --user NAME to run it as another user",
            err=True,
        )
    herder = str(Path(sys.executable).with_name("herder"))
    if not os.access(herder, os.X_OK):
        herder = shutil.which("herder") or "herder"
    argv = service.run_argv(herder, cfg, config_file, given)
    try:
        if kind == "systemd":
            group = grp.getgrgid(entry.pw_gid).gr_name
            text = service.render_systemd(cfg, argv, user, group)
        else:
            text = service.render_launchd(cfg, argv, user, label)
    except service.Refused as exc:
        raise click.UsageError(str(exc)) from None
    # launchd creates no directory, and opens the log in the state dir as the user before herder starts.
    if kind == "launchd" or service.state_directory(cfg.state_dir) is None:
        click.echo(
            f"herder: note: create the state dir before the service starts: "
            f"install -d -m 0700 -o {user} {os.path.abspath(cfg.state_dir)}",
            err=True,
        )
    if output:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)
    else:
        click.echo(text, nl=False)


@cli.command("config")
@run_options
@click.option("--example", is_flag=True, help="Print a commented config file with every default.")
@click.pass_context
def show_config(ctx: click.Context, example: bool, **opts) -> None:
    """Print the effective configuration and where each value came from (secrets redacted)."""
    if example:
        click.echo(settings.example_file(), nl=False)
        return
    try:
        cfg, sources = resolve_settings(ctx, opts)
        if cfg.user:  # as `herder run` would refuse it (whether this caller may switch: run's to say)
            try:
                pwd.getpwnam(cfg.user)
            except KeyError:
                raise ConfigError(
                    "user", f"no such user: {cfg.user!r}", sources.get("user", "default")
                ) from None
    except ConfigError as exc:
        click.echo(f"herder: {exc}", err=True)
        sys.exit(EX_CONFIG)
    rows = settings.describe(cfg, sources)
    width = max(len(k) for k, _, _ in rows)
    for key, value, source in rows:
        click.echo(f"{key:<{width}}  {value:<40}  # {source}")


def pool_option(f):  # noqa: ANN001, ANN201 - a click decorator
    return click.option(
        "--pool", help='The pool to act on (docs/operations.md, "Pools"); default: every pool.'
    )(f)


def pool_command(f):  # noqa: ANN001, ANN201 - a click decorator
    """A command on this host's pools: every pool, or --pool; --state-dir finds the herder."""
    return cli.command()(state_dir_option(pool_option(f)))


def one_pool_option(f):  # noqa: ANN001, ANN201 - a click decorator
    # `scale` sizes one pool: with several, the master refuses a scale that names none.
    return click.option(
        "--pool",
        help='The pool to scale (docs/operations.md, "Pools"); required when there are several.',
    )(f)


def with_pool(body: dict, pool: str | None) -> dict:
    return body | ({"pool": pool} if pool else {})


def state_dir_option(f):
    return click.option(
        "--state-dir",
        envvar="HERDER_STATE_DIR",
        show_envvar=True,
        help="The state dir of the herder to talk to (as given to `herder run`). Default: the first "
        "where a herder answers of `herder run`'s default and an installed service's "
        f"({startup.service_state_dir()}).",
    )(f)


def find_herder(state_dir: str | None) -> str:
    """The state dir named, else where a herder answers (client.locate); exit 4 if none does."""
    if state_dir:
        return state_dir
    try:
        return client.locate(startup.state_dirs_to_try())
    except client.Unreachable as exc:
        click.echo(f"herder: {exc}", err=True)
        sys.exit(render.EXIT_UNREACHABLE)


def ask(state_dir: str | None, body: dict) -> dict:
    """One request to the running herder (client.request); exit 4 (like supervisorctl) if it
    cannot be reached, 1 if it refuses."""
    try:
        reply = client.request(find_herder(state_dir), body)
    except client.Unreachable as exc:
        click.echo(f"herder: {exc}", err=True)
        sys.exit(render.EXIT_UNREACHABLE)
    if not reply.get("ok"):
        click.echo(f"herder: {reply.get('error', 'request failed')}", err=True)
        sys.exit(1)
    return reply


@cli.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
def status(state_dir: str | None, as_json: bool, watch: bool) -> None:
    """Show the fleet. Exit 0: all running; 3: something is not (or still starting); 4: herder
    not reachable."""
    if watch:
        # Ctrl-C ends --watch even when a script started it with SIGINT ignored (a background
        # job of a non-interactive shell inherits SIG_IGN, and Python then keeps it).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status_loop(state_dir, as_json, watch)
    except KeyboardInterrupt:
        sys.exit(0)


def status_loop(state_dir: str | None, as_json: bool, watch: bool) -> None:
    while True:
        reply = ask(state_dir, {"cmd": "status"})
        if as_json:
            click.echo(json.dumps(reply, indent=2, default=str))
        else:
            if watch:
                click.clear()
            click.echo(render.render(reply))
        if not watch:
            sys.exit(render.exit_code(reply))
        time.sleep(1.0)


@cli.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the advice as a JSON list.")
@click.option("--pool", help="Only this pool's advice.")
def advise(state_dir: str | None, as_json: bool, pool: str | None) -> None:
    """What herder would change in each pool, from what it saw: threads or processes, recycling,
    bounds; each with its figures and the jobs and minutes it rests on (docs/advice.md). It
    changes nothing. Exit 0; 4: herder not reachable."""
    advice = ask(state_dir, {"cmd": "status"}).get("advice", [])
    if pool is not None:
        advice = [a for a in advice if a["pool"] == pool]
    click.echo(json.dumps(advice, indent=2) if as_json else render.render_advice(advice))


@cli.command()
@state_dir_option
@click.argument("workers", type=click.IntRange(min=1), required=False)
@click.option("--min", "min_workers", type=click.IntRange(min=0), help="Autoscaling: new minimum.")
@click.option("--max", "max_workers", type=click.IntRange(min=1), help="Autoscaling: new maximum.")
@one_pool_option
def scale(
    state_dir: str | None,
    workers: int | None,
    min_workers: int | None,
    max_workers: int | None,
    pool: str | None,
) -> None:
    """Set the number of workers (N), or the autoscaling bounds (--min/--max), of the one pool
    or of the pool named with --pool."""
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
    reply = ask(state_dir, with_pool(body, pool))
    where = "" if reply.get("pool", "default") == "default" else f"pool {reply['pool']}: "
    click.echo(f"{where}desired {reply['desired']} workers (min {reply['min']}, max {reply['max']})")


STOP_MARGIN = 30.0  # past the drain: the watchdog's own backstop (10 s), then the embedded Redis's stop


@cli.command()
@state_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Seconds each worker gets to finish its job.",
)
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for herder to exit.")
def stop(state_dir: str | None, timeout: float | None, no_wait: bool) -> None:
    """Stop herder gracefully: every running job finishes (up to the stop timeout). Returns when
    all of herder has exited (its watchdog last, after the workers and an embedded Redis)."""
    body: dict = {"cmd": "stop"}
    if timeout is not None:
        body["timeout"] = timeout
    path = find_herder(state_dir)
    reply = ask(path, body)
    click.echo(f"stopping {reply['stopping']} workers")
    if no_wait:
        return
    budget = reply.get("drain_seconds")  # None from an older master: wait as long as it takes
    deadline = None if budget is None else time.monotonic() + float(budget) + STOP_MARGIN
    while not exited(path):
        if deadline is not None and time.monotonic() > deadline:
            pid = statelock.holder(path)
            click.echo(
                f"herder: still running {float(budget) + STOP_MARGIN:g} s after the stop began "
                f"(watchdog pid {pid or 'unknown'}, state dir {path})",
                err=True,
            )
            sys.exit(1)
        time.sleep(0.2)
    click.echo("stopped")


@cli.command()
@state_dir_option
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Give up waiting after this long (the hand-over goes on).  [default: until it ends]",
)
def upgrade(state_dir: str | None, timeout: float | None) -> None:
    """Run the installed herder without a dip: a new master starts beside the running one, and
    takes its workers over one by one as each finishes its job (pip install --upgrade first).
    Exits non-zero, the running master untouched, if the installed herder cannot start."""
    from herder.supervisor.ctl.upgrade import upgrade as run_upgrade

    sys.exit(run_upgrade(find_herder(state_dir), timeout))


def exited(state_dir: str) -> bool:
    """All of herder is gone: its watchdog, the last to exit, no longer holds the state dir's lock.
    Where the lock cannot be read, the master's control socket no longer answering."""
    held = statelock.held(state_dir)
    if held is not None:
        return not held
    try:
        client.call(state_dir, {"cmd": "ping"}, timeout=2)
    except TimeoutError:  # a master too busy to answer at once is still there
        return False
    except (OSError, ValueError):
        return True
    return False


def parse_arg(text: str) -> object:
    """A job argument: JSON when it parses (42, 1.5, true, null, [1], {"a": 1}), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


@cli.command()
@state_dir_option
@click.option("--queue", help="Queue to put the job on.  [default: herder's first queue]")
@click.argument("func")
@click.argument("args", nargs=-1)
def enqueue(state_dir: str | None, queue: str | None, func: str, args: tuple[str, ...]) -> None:
    """Enqueue FUNC(ARGS...) on the running herder's Redis, e.g. `herder enqueue jobs.add 1 2`.

    ARGS are JSON when they parse (numbers, true, null, lists, objects), else strings.
    """
    body = {"cmd": "enqueue", "func": func, "args": [parse_arg(a) for a in args]}
    if queue:
        body["queue"] = queue
    reply = ask(state_dir, body)
    click.echo(f"{reply['job_id']} on {reply['queue']}")


@pool_command
def restart(state_dir: str | None, pool: str | None) -> None:
    """Rolling restart (of every pool, or of --pool): each replacement starts before an old
    worker stops; no job is interrupted."""
    reply = ask(state_dir, with_pool({"cmd": "restart"}, pool))
    click.echo(f"replacing {reply['replacing']} workers, a batch at a time")


@pool_command
def pause(state_dir: str | None, pool: str | None) -> None:
    """This host's workers (of every pool, or of --pool) finish their jobs and take no new
    ones, until `herder resume` (for every host at once, RQ's own `rq suspend` works too)."""
    reply = ask(state_dir, with_pool({"cmd": "pause"}, pool))
    click.echo(f"paused: {reply['workers']} workers finish their jobs and take no new ones")


@pool_command
def resume(state_dir: str | None, pool: str | None) -> None:
    """Undo `herder pause` (of every pool, or of --pool): the workers take jobs again."""
    reply = ask(state_dir, with_pool({"cmd": "resume"}, pool))
    click.echo(f"resumed: {reply['workers']} workers take jobs again")


@cli.command()
@state_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON.")
def reload(state_dir: str | None, as_json: bool) -> None:
    """Re-read the config file (as SIGHUP does): changed settings apply, workers restart
    (rolling) for those only new workers pick up; a setting that needs a restart of herder
    refuses the whole reload."""
    reply = ask(state_dir, {"cmd": "reload"})
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    pools = reply.get("pools", [])
    if not reply["applied"] and not reply["restart_workers"] and not pools:
        click.echo("reloaded: nothing changed")
        return
    click.echo(f"reloaded; applied: {', '.join(reply['applied']) or 'nothing'}")
    for line in pools:  # pool NAME added / removed (drains) / changed (KEYS: rolled)
        click.echo(line)
    if reply["restart_workers"]:
        click.echo(
            f"rolling restart of {reply['replacing']} workers for: {', '.join(reply['restart_workers'])}"
        )


def main() -> None:
    cli(prog_name="herder")


if __name__ == "__main__":
    main()
