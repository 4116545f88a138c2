"""`herder install-service systemd|launchd`: render a unit or a plist from deploy/*/*.in.

The templates live in deploy/ (shipped in the wheel under share/herder). The service runs
`herder run` with every setting install-service was given (flag or HERDER_* variable) on its
command line, so what was asked is what runs; a config file given with --config is named there
and read by the service itself. Values that come from the configuration: the stop timeout sets
how long the service manager waits before SIGKILL (always above herder's own drain), the state
dir is made writable.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from string import Template
from typing import Any
from xml.sax.saxutils import escape

from herder.common import config as settings
from herder.common.config import Config

TEMPLATES = {"systemd": "herder.service.in", "launchd": "herder.plist.in"}
SYSTEMD_STATE_ROOT = "/var/lib/"  # where systemd's StateDirectory= creates directories
ENVIRONMENT_FILE = "/etc/herder/environment"  # the unit's EnvironmentFile=, 0600: secrets go here

# Settings that name a file or directory: made absolute, as the service does not run in the
# directory install-service was run from (systemd starts it in /).
PATH_KEYS = ("state_dir", "paths", "http_token_file")


class Refused(Exception):
    """A setting the service file cannot carry: the message names its flag."""


def template_path(kind: str) -> Path:
    """deploy/<kind>/ in a checkout; <prefix>/share/herder once installed from a wheel."""
    name = TEMPLATES[kind]
    for base in (
        Path(__file__).resolve().parents[2] / "deploy" / kind,
        Path(sys.prefix) / "share" / "herder",
    ):
        if (base / name).is_file():
            return base / name
    raise FileNotFoundError(f"template {name} not found in deploy/{kind}/ or {sys.prefix}/share/herder")


def watchdog_budget(cfg: Config) -> int:
    """WatchdogSec: herder's watchdog must replace a hung master before systemd replaces all of
    herder. The pings stop 3 heartbeats into a master's silence and the last one may be half a
    WatchdogSec old, so WatchdogSec/2 + 3 heartbeats must exceed master_heartbeat_timeout
    (docs/deploy/systemd.md, "Watchdogs"): 30 s for the defaults, more for a patient master."""
    needed = 2 * (cfg.master_heartbeat_timeout - 3 * cfg.heartbeat_interval) + 6
    return max(30, math.ceil(needed))


def stop_budget(cfg: Config) -> int:
    """Seconds the service manager should allow for a stop: herder's drain plus margin."""
    return int(cfg.drain_seconds + 15)  # the longest pool's stop timeout, then the kill


def secret_refusal(kind: str, key: str, value: str, source: str) -> str | None:
    """Why a given value cannot go into a service file (units and plists are world-readable),
    or None."""
    if key not in settings.SECRET_KEYS or settings.redact_setting(key, value) == value:
        return None
    flag, var = settings.flag_of(key), settings.env_of(key)
    given = flag if source.startswith("command line") else f"{var} (from the environment)"
    where = f"`{key} = ...` in the config file (mode 0600, named with --config)"
    if kind == "systemd":
        where += f", or {var}=... in {ENVIRONMENT_FILE} (mode 0600; the unit reads it)"
    return (
        f"{given} carries a secret (a password, or a webhook's path), and a {kind} service file "
        f"is world-readable: leave it out of this command and give it as {where}"
    )


def absolute(key: str, value: Any) -> Any:
    """A path setting's value as the service must see it (it runs elsewhere than here)."""
    if key in PATH_KEYS:
        if isinstance(value, list | tuple):
            return [os.path.abspath(v) for v in value]
        return os.path.abspath(value)
    if key == "cron" and isinstance(value, str) and value.endswith(".py"):  # a file, not a module
        return os.path.abspath(value)
    return value


def setting_args(given: dict[str, Any]) -> list[str]:
    """`herder run`'s arguments for the settings given: `--queue a --queue b`, `--no-scheduler`.
    Each value as it was given (a string, or a bool of a --x/--no-x flag), so `herder run`
    parses it exactly as install-service did."""
    argv: list[str] = []
    for key in settings.KEYS:  # the schema's order: a stable, readable command line
        if key not in given:
            continue
        value, flag = absolute(key, given[key]), settings.flag_of(key)
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, list | tuple):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


def run_argv(herder: str, cfg: Config, config_file: str | None, given: dict[str, Any]) -> list[str]:
    """The service's command: `herder run --state-dir DIR [--config FILE] [settings given]`.
    The user is the service manager's (User=, UserName), not `herder run --user`'s."""
    argv = [herder, "run", "--state-dir", os.path.abspath(cfg.state_dir)]
    if config_file:
        argv += ["--config", os.path.abspath(config_file)]
    return argv + setting_args({k: v for k, v in given.items() if k not in ("state_dir", "user")})


# systemd's command line (systemd.service(5), "Command lines"; systemd.syntax(7), "Quoting"): split
# on whitespace, "..." quoting with C escapes, then % specifiers and, at start, $VAR expansion.
_SYSTEMD_BARE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_C_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _c_escape(c: str) -> str:
    if c in _C_ESCAPES:
        return _C_ESCAPES[c]
    return f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c


def systemd_quote(arg: str) -> str:
    """One argument as an ExecStart= word that systemd turns back into exactly `arg`: quoted
    unless plain, backslashes, quotes and control characters C-escaped, `%` written `%%` (a
    specifier otherwise) and `$` written `$$` (an environment variable otherwise)."""
    word = arg if _SYSTEMD_BARE.fullmatch(arg) else '"' + "".join(map(_c_escape, arg)) + '"'
    return word.replace("%", "%%").replace("$", "$$")


def state_directory(state_dir: str) -> str | None:
    """StateDirectory= for a state dir under /var/lib (systemd creates it, owned by User=), else None."""
    path = os.path.abspath(state_dir)
    if path.startswith(SYSTEMD_STATE_ROOT) and len(path) > len(SYSTEMD_STATE_ROOT):
        return path[len(SYSTEMD_STATE_ROOT) :]
    return None


def render_systemd(cfg: Config, argv: list[str], user: str, group: str) -> str:
    state_dir = os.path.abspath(cfg.state_dir)
    if not _SYSTEMD_BARE.fullmatch(state_dir):  # ReadWritePaths= and StateDirectory= quote their own way
        raise Refused(
            f"--state-dir {state_dir!r}: a systemd unit takes a state dir of letters, digits and "
            "_@+=:,./- only"
        )
    text = Template(template_path("systemd").read_text()).substitute(
        after="redis-server.service" if not cfg.embedded_redis and cfg.redis_url else "",
        exec_start=" ".join(systemd_quote(a) for a in argv),
        timeout_stop=f"{stop_budget(cfg)}s",
        watchdog_sec=f"{watchdog_budget(cfg)}s",
        user=user,
        group=group,
        state_dir=state_dir,
    )
    sub = state_directory(state_dir)
    if sub is None:  # elsewhere: it must exist before the unit starts (ProtectSystem=strict)
        text = text.replace("StateDirectory=herder\nStateDirectoryMode=0700\n", "")
    else:
        text = text.replace("StateDirectory=herder\n", f"StateDirectory={sub}\n")
    # Secrets belong in a 0600 file, not in a world-readable unit: HERDER_REDIS_URL=... there.
    return text.replace(
        "Environment=PYTHONUNBUFFERED=1",
        f"Environment=PYTHONUNBUFFERED=1\nEnvironmentFile=-{ENVIRONMENT_FILE}",
    )


_XML_UNFIT = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # not allowed in an XML 1.0 document


def render_launchd(cfg: Config, argv: list[str], user: str, label: str) -> str:
    for a in argv:
        if _XML_UNFIT.search(a):
            raise Refused(f"the argument {a!r} holds a control character, which a plist cannot carry")
    args = "\n".join(f"    <string>{escape(a)}</string>" for a in argv)
    return Template(template_path("launchd").read_text()).substitute(
        label=escape(label),
        program_arguments=args,
        exit_timeout=stop_budget(cfg),
        log_path=escape(str(Path(os.path.abspath(cfg.state_dir)) / "herder.log")),
        user=escape(user),
    )
