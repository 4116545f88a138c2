"""`herder install-service` keeps what it is given: every `herder run` setting passed to it (flag
or HERDER_* variable) is on the service's command line, read back as systemd and launchd read
it and parsed by `herder run`'s own options to the same values; a secret is refused instead.

The unit's ExecStart= is split here by systemd's rules (systemd.service(5), "Command lines";
systemd.syntax(7), "Quoting"), written independently of the renderer: words split on
whitespace, "..." or '...' quoting, C escapes, then `%%` -> `%` (any other `%x` is a specifier
systemd would expand) and `$$` -> `$` (a `$NAME` would be expanded from the environment).
"""

from __future__ import annotations

import os
import plistlib
import pwd
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from herder.common import config as settings
from herder.supervisor.ctl.cli import cli, resolve_settings, run

ME = pwd.getpwuid(os.geteuid()).pw_name
TRICKY = "a b $HOME ${X} %n %% \"q\" 's' \\ ; é"  # everything systemd would read differently


def values(tmp: Path) -> dict[str, list[str]]:
    """A value for every setting, none its default, as the flags that give it: a new setting
    without one here fails test_every_setting_has_a_value, so none is dropped unseen."""
    (tmp / "app dir").mkdir(exist_ok=True)
    (tmp / "cron_jobs.py").write_text("")
    (tmp / "svc_rq_settings.py").write_text("")
    (tmp / "svc_django_settings.py").write_text("")
    (tmp / "token").write_text("t" * 32)
    return {
        "redis_url": ["redis://db.internal:6390/2"],
        "queues": ["high", "low $HOME %n"],
        "workers": ["3"],
        "min_workers": ["2"],
        "max_workers": ["9"],
        "workers_limit": ["40"],
        "scale_interval": ["0.5"],
        "scale_down_delay": ["12.5"],
        "drain_target": ["20"],
        "max_wait": ["7.5"],
        "host_id": [TRICKY],
        "cluster_max_workers": ["30"],
        "host_ttl": ["11"],
        "job_timeout": ["200"],
        "job_timeout_grace": ["11"],
        "heartbeat_interval": ["2"],
        "heartbeat_timeout": ["12"],
        "redis_timeout": ["4"],
        "progress_timeout": ["40"],
        "start_timeout": ["31"],
        "stop_timeout": ["100"],
        "kill_timeout": ["6"],
        "max_requeues": ["4"],
        "worker_nice": ["7"],
        "sweep_interval": ["2"],
        "kill_budget": ["0.25"],
        "kill_budget_window": ["61"],
        "min_uptime": ["2"],
        "backoff_initial": ["0.2"],
        "backoff_max": ["31"],
        "master_heartbeat_timeout": ["16"],
        "max_restarts": ["6"],
        "restart_window": ["61"],
        "paths": [str(tmp), str(tmp / "app dir")],
        "worker_command": ["python3 -c 'print(\"100%\")' $HOME"],
        "state_dir": [str(tmp / "state")],
        "log_level": ["DEBUG"],
        "log_format": ["json"],
        "user": [ME],
        "cull_failures": ["6"],
        "cull_failure_window": ["61"],
        "cull_budget": ["11"],
        "cull_window": ["601"],
        "max_jobs": ["100"],
        "max_jobs_jitter": ["5"],
        "max_age": ["3600"],
        "max_age_jitter": ["60"],
        "max_memory": ["512"],
        "max_memory_hard": ["900"],
        "recycle_share": ["0.2"],
        "scheduler": [False],
        "cron": [str(tmp / "cron_jobs.py")],
        "fork_server": [False],
        "preload": ["json", "os.path"],
        "threads": ["3"],
        "fast_path": [False],
        "worker_class": ["app.workers.Worker"],
        "job_class": ["app.jobs.Job"],
        "queue_class": ["app.queues.Queue"],
        "serializer": ["json"],
        "exception_handlers": ["app.errors.report", "app.errors.log"],
        "disable_default_exception_handler": [True],
        "results_ttl": ["600"],
        "worker_ttl": ["500"],
        "maintenance_interval": ["300"],
        "dequeue_strategy": ["round_robin"],
        "rq_config": ["svc_rq_settings"],
        "http": ["127.0.0.1:9555"],
        "http_token_file": [str(tmp / "token")],
        "health_grace": ["11"],
        "on_event": ["logger -t herder 'a b' 50%"],
        "on_event_url": ["https://hooks.example.com"],
        "on_event_timeout": ["12"],
        "worker_init": ["app.hooks:init"],
        "django_settings": ["svc_django_settings"],
    }


# Settings given in a second render: threads > 1 runs herder's own workers (no worker_command or
# worker_class), a fixed --workers conflicts with --max-workers.
SEPARATELY = ("threads", "workers")


def flags(given: dict[str, list]) -> list[str]:
    out: list[str] = []
    for key, items in given.items():
        flag = settings.flag_of(key)
        for item in items:
            out += [flag if item is True else "--no-" + flag[2:]] if isinstance(item, bool) else [flag, item]
    return out


def install_service(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    clean = {k: None for k in os.environ if k.startswith("HERDER_") or k == "DJANGO_SETTINGS_MODULE"}
    r = CliRunner().invoke(cli, ["install-service", *args], env={**clean, **(env or {})})
    return r.exit_code, r.stdout, r.stderr


def c_unescape(text: str, i: int) -> tuple[str, int]:
    """One C escape of systemd's (text[i] is the backslash): its character and the next index."""
    c = text[i + 1]
    simple = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
    if c in simple:
        return simple[c], i + 2
    if c in "\\\"'":
        return c, i + 2
    if c == "x":
        return chr(int(text[i + 2 : i + 4], 16)), i + 4
    raise AssertionError(f"an escape systemd refuses: {text[i : i + 2]!r}")


def systemd_words(line: str) -> list[str]:
    """ExecStart='s value as systemd splits and unquotes it, before specifiers and variables."""
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i].isspace():
            i += 1
            continue
        assert not (line[i] == ";" and (i + 1 == len(line) or line[i + 1].isspace())), (
            "a lone ; separates commands"
        )
        word, quote = "", None
        while i < len(line) and (quote or not line[i].isspace()):
            c = line[i]
            if quote and c == quote:
                quote, i = None, i + 1
            elif not quote and c in "\"'":
                quote, i = c, i + 1
            elif c == "\\":
                ch, i = c_unescape(line, i)
                word += ch
            else:
                word, i = word + c, i + 1
        assert quote is None, f"an unclosed quote in {line!r}"
        words.append(word)
    return words


def systemd_resolve(word: str) -> str:
    """A word after systemd's specifiers (only %% may be left) and environment ($$ only)."""
    assert not re.search(r"%[^%]", word.replace("%%", "")), f"a specifier systemd would expand: {word!r}"
    word = word.replace("%%", "%")
    assert not re.search(r"\$[{A-Za-z_]", word.replace("$$", "")), (
        f"a variable systemd would expand: {word!r}"
    )
    return word.replace("$$", "$")


def exec_start(unit: str) -> list[str]:
    (line,) = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return [systemd_resolve(w) for w in systemd_words(line.removeprefix("ExecStart="))]


def unit_value(unit: str, key: str) -> str:
    (line,) = [line for line in unit.splitlines() if line.startswith(key + "=")]
    return line.split("=", 1)[1]


def as_run_parses(args: list[str]) -> tuple[settings.Config, dict[str, str]]:
    """`herder run ARGS`'s settings, resolved by its own options (nothing is started)."""
    ctx = run.make_context("run", list(args))
    return resolve_settings(ctx, dict(ctx.params))


def assert_carried(argv: list[str], given: dict[str, list], tmp: Path) -> None:
    """The service's `herder run` has every setting given, from its command line, at its value."""
    assert argv[1] == "run", argv
    cfg, sources = as_run_parses(argv[2:])
    want, _ = as_run_parses(flags(given))
    for key in given:
        if key == "user":  # the service's user: User= / UserName, not herder run's --user
            continue
        assert sources[key].startswith("command line"), (key, sources[key])
        assert getattr(cfg, key) == getattr(want, key), key


def test_every_setting_has_a_value(tmp_path: Path) -> None:
    assert set(values(tmp_path)) == set(settings.KEYS)


@pytest.mark.parametrize("kind", ["systemd", "launchd"])
def test_every_setting_reaches_the_service(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    every = values(tmp_path)
    renders = [
        {k: v for k, v in every.items() if k not in SEPARATELY},
        {k: every[k] for k in (*SEPARATELY, "state_dir", "user")},
    ]
    for given in renders:
        code, out, err = install_service(kind, *flags(given))
        assert code == 0, err
        if kind == "systemd":
            argv = exec_start(out)
            assert unit_value(out, "User") == ME
            (tmp_path / "herder.service").write_text(out)
            if shutil.which("systemd-analyze"):  # systemd's own parser takes every word
                verify = subprocess.run(
                    ["systemd-analyze", "verify", str(tmp_path / "herder.service")],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert verify.returncode == 0, verify.stdout + verify.stderr
        else:
            plist = plistlib.loads(out.encode())
            argv = plist["ProgramArguments"]
            assert plist["UserName"] == ME
            # launchd creates no directory, and opens the log in the state dir before herder starts.
            assert f"install -d -m 0700 -o {ME} {given['state_dir'][0]}" in err
        assert_carried(argv, given, tmp_path)


def test_relative_paths_are_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The service does not start where install-service ran (systemd starts it in /)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    code, out, err = install_service("systemd", "--state-dir", "st", "--path", "app", "--user", ME)
    assert code == 0, err
    cfg, _ = as_run_parses(exec_start(out)[2:])
    assert cfg.state_dir == str(tmp_path / "st") and cfg.paths == [str(tmp_path / "app")]
    assert unit_value(out, "ReadWritePaths") == str(tmp_path / "st")
    assert "StateDirectory=" not in out  # not under /var/lib: the note says to create it
    assert f"install -d -m 0700 -o {ME} {tmp_path / 'st'}" in err


def test_the_default_state_dir_is_systemds_state_directory() -> None:
    code, out, err = install_service("systemd", "--workers", "3", "--queue", "high", "--user", ME)
    assert code == 0, err
    assert exec_start(out)[2:] == ["--state-dir", "/var/lib/herder", "--queue", "high", "--workers", "3"]
    assert unit_value(out, "StateDirectory") == "herder"
    assert unit_value(out, "ReadWritePaths") == "/var/lib/herder"


def test_environment_variables_reach_the_unit_and_are_named(tmp_path: Path) -> None:
    conf = tmp_path / "herder.toml"
    conf.write_text("[herder]\nstop_timeout = 50\n")
    env = {"HERDER_WORKERS": "4", "HERDER_SCHEDULER": "false", "HERDER_QUEUE": "a,b"}
    code, out, err = install_service("systemd", "--user", ME, env={**env, "HERDER_CONFIG": str(conf)})
    assert code == 0, err
    cfg, sources = as_run_parses(exec_start(out)[2:])
    assert (cfg.workers, cfg.scheduler, cfg.queues, cfg.stop_timeout) == (4, False, ["a", "b"], 50)
    assert sources["workers"].startswith("command line") and sources["stop_timeout"].startswith("file")
    for name in [*env, "HERDER_CONFIG"]:
        assert name in err, name


@pytest.mark.parametrize("kind", ["systemd", "launchd"])
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--redis-url", "redis://:s3cret@db:16390/0"], {}, "--redis-url"),
        (["--redis-url", "redis://db:16390/0?password=s3cret"], {}, "--redis-url"),
        ([], {"HERDER_REDIS_URL": "rediss://u:s3cret@db:16390/0"}, "HERDER_REDIS_URL"),
        (["--on-event-url", "https://hooks.slack.com/services/T0/B0/s3cret"], {}, "--on-event-url"),
    ],
)
def test_a_secret_is_refused_with_where_it_goes(kind: str, args: list[str], env: dict, named: str) -> None:
    code, out, err = install_service(kind, "--user", ME, *args, env=env)
    assert code == 2, (out, err)
    assert "s3cret" not in out + err
    assert named in err and "0600" in err and "--config" in err
    assert ("/etc/herder/environment" in err) == (kind == "systemd")


def test_a_redis_url_without_a_password_goes_on_the_command_line() -> None:
    code, out, err = install_service("systemd", "--user", ME, "--redis-url", "redis://db:16390/3")
    assert code == 0, err
    assert as_run_parses(exec_start(out)[2:])[0].redis_url == "redis://db:16390/3"
    assert "After=network-online.target redis-server.service" in out


def test_the_dashboard_token_in_the_environment_is_left_out_with_a_warning() -> None:
    code, out, err = install_service("systemd", "--user", ME, env={"HERDER_HTTP_TOKEN": "t0ken" * 8})
    assert code == 0, err
    assert "t0ken" not in out and "HERDER_HTTP_TOKEN" in err and "/etc/herder/environment" in err


def test_install_service_user_help_says_it_is_the_services_user() -> None:
    r = CliRunner().invoke(cli, ["install-service", "--help"], terminal_width=200)
    text = " ".join(r.stdout.split())
    assert "the unit's User= (systemd) or the plist's UserName (launchd)" in text
    run_help = " ".join(CliRunner().invoke(cli, ["run", "--help"], terminal_width=200).stdout.split())
    assert settings.HELP["user"] in run_help
