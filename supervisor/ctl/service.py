"""`herder install-service systemd|launchd`: render a unit or a plist from scripts/*.in.

The templates live in scripts/ (shipped in the wheel under share/herder). Values that come
from the configuration: the stop timeout sets how long the service manager waits before
SIGKILL (always above herder's own drain), the state dir is made writable.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from string import Template
from xml.sax.saxutils import escape

from herder.common.config import Config

TEMPLATES = {"systemd": "herder.service.in", "launchd": "herder.plist.in"}


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


def stop_budget(cfg: Config) -> int:
    """Seconds the service manager should allow for a stop: herder's drain plus margin."""
    return int(cfg.drain_seconds + 15)  # the longest pool's stop timeout, then the kill


def run_argv(herder: str, cfg: Config, config_file: str | None) -> list[str]:
    argv = [herder, "run", "--state-dir", cfg.state_dir]
    if config_file:
        argv += ["--config", config_file]
    return argv


def render_systemd(cfg: Config, herder: str, user: str, group: str, config_file: str | None) -> str:
    argv = run_argv(herder, cfg, config_file)
    text = Template(template_path("systemd").read_text()).substitute(
        after="redis-server.service" if not cfg.embedded_redis and cfg.redis_url else "",
        exec_start=" ".join(shlex.quote(a) for a in argv),
        timeout_stop=f"{stop_budget(cfg)}s",
        watchdog_sec="30s",
        user=user,
        group=group,
        state_dir=cfg.state_dir,
    )
    # Secrets belong in a 0600 file, not in a world-readable unit: HERDER_REDIS_URL=... there.
    return text.replace(
        "Environment=PYTHONUNBUFFERED=1",
        "Environment=PYTHONUNBUFFERED=1\nEnvironmentFile=-/etc/herder/environment",
    )


def render_launchd(cfg: Config, herder: str, user: str, config_file: str | None, label: str) -> str:
    argv = run_argv(herder, cfg, config_file)
    args = "\n".join(f"    <string>{escape(a)}</string>" for a in argv)
    return Template(template_path("launchd").read_text()).substitute(
        label=escape(label),
        program_arguments=args,
        exit_timeout=stop_budget(cfg),
        log_path=escape(str(Path(cfg.state_dir) / "herder.log")),
        user=escape(user),
    )
