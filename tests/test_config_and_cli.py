"""Configuration errors, secrets in logs, and herder's own packages being shadowed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

from harness import HERDER, run_herder, start_redis, wait_for
from herder.common.config import EX_CONFIG, Config, ConfigError, redact_url, validate


def test_redact_url_hides_passwords() -> None:
    assert redact_url("redis://:s3cret@host:6380/0") == "redis://:***@host:6380/0"
    assert redact_url("redis://user:s3cret@host/0") == "redis://user:***@host/0"
    assert redact_url("redis://host:6390/0") == "redis://host:6390/0"
    assert "s3cret" not in redact_url("redis://host/0?password=s3cret")
    assert redact_url(None) == "(none)"
    assert redact_url("unix:///run/herder/redis.sock?db=0") == "unix:///run/herder/redis.sock?db=0"
    assert (
        redact_url("unix://:pw@/run/r.sock?db=0&password=pw") == "unix://:***@/run/r.sock?db=0&password=***"
    )
    assert redact_url("rediss://u:p%40ss@h:1/0") == "rediss://u:***@h:1/0"


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"workers": 0}, "workers"),
        ({"heartbeat_timeout": 0.5, "heartbeat_interval": 1.0}, "heartbeat_timeout"),
        ({"heartbeat_timeout": 1.9, "heartbeat_interval": 0.5}, "heartbeat_timeout"),  # slices are >= 1 s
        ({"heartbeat_timeout": 5.9, "heartbeat_interval": 3.0}, "heartbeat_timeout"),
        ({"workers": 9, "workers_limit": 8}, "workers"),
        ({"max_workers": 9, "workers_limit": 8}, "max_workers"),
        ({"min_workers": 9, "max_workers": 5, "workers_limit": 8}, "min_workers"),
        ({"workers_limit": 0}, "workers_limit"),
        ({"stop_timeout": -1}, "stop_timeout"),
        ({"queues": []}, "queues"),
        ({"queues": ["default", ""]}, "queues"),
        ({"queues": ["tab\there"]}, "queues"),
        ({"queues": ["a,b"], "worker_command": ["./my-worker"]}, "queues"),  # HERDER_QUEUES is a,b
        ({"threads": 0}, "threads"),
        ({"threads": 256}, "threads"),  # a thread's tag must fit the protocol
        ({"threads": 2, "worker_command": ["./my-worker"]}, "threads"),
        ({"threads": 2, "worker_class": "app.MyWorker"}, "threads"),
        ({"redis_url": "http://x"}, "redis_url"),
        ({"log_level": "LOUD"}, "log_level"),
    ],
)
def test_config_validation_names_the_key(change: dict, key: str) -> None:
    cfg = Config(**change)
    with pytest.raises(ConfigError) as err:
        validate(cfg, {key: "environment"})
    assert err.value.key == key
    assert f"'{key}' from environment" in str(err.value)


def test_a_queue_name_is_whatever_rq_accepts() -> None:
    names = ["bulk jobs", "a,b", "ünïcode", "with%percent"]
    cfg = Config(queues=list(names))
    validate(cfg)  # raises ConfigError on a name it refuses
    assert cfg.queues == names
    with pytest.raises(ConfigError, match="queues"):  # an empty name is a typo, not a queue
        validate(Config(queues=[*names, ""]))


def test_a_heartbeat_timeout_of_two_dequeue_slices_is_the_shortest_allowed() -> None:
    validate(Config(heartbeat_interval=0.5, heartbeat_timeout=2.0))
    validate(Config(heartbeat_interval=3.0, heartbeat_timeout=6.0))
    with pytest.raises(ConfigError, match=r"at least twice max\(1 s, heartbeat_interval\), 6 s.*idle"):
        validate(Config(heartbeat_interval=3.0, heartbeat_timeout=5.0))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "key"),
    [
        (["--workers", "100000"], "'workers' from command line"),
        (["--max-workers", "50", "--workers-limit", "40"], "'max_workers' from command line"),
        (["--min-workers", "41", "--max-workers", "41", "--workers-limit", "40"], "'max_workers'"),
    ],
)
def test_a_worker_count_above_the_workers_limit_exits_78_naming_key_and_limit(
    tmp_path: Path, args: list[str], key: str
) -> None:
    from herder.common.config import default_workers_limit

    r = run_herder("--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path), *args)
    assert r.returncode == EX_CONFIG, r.stderr
    limit = 40 if "--workers-limit" in args else default_workers_limit()[0]
    assert key in r.stderr and f"workers limit of {limit}" in r.stderr


@pytest.mark.slow
def test_a_heartbeat_timeout_that_would_kill_idle_workers_exits_78(tmp_path: Path) -> None:
    f = tmp_path / "herder.toml"
    f.write_text("[herder]\nheartbeat_interval = 2\nheartbeat_timeout = 3\n")
    r = run_herder("--config", str(f), "--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path))
    assert r.returncode == EX_CONFIG
    assert f"'heartbeat_timeout' from file {f}" in r.stderr and "kill healthy idle workers" in r.stderr


@pytest.mark.slow
def test_bad_value_from_environment_exits_78_naming_key_and_source(tmp_path: Path) -> None:
    r = run_herder(
        "--state-dir",
        str(tmp_path),
        env={"HERDER_REDIS_URL": "redis://127.0.0.1:1/0", "HERDER_STOP_TIMEOUT": "-3"},
    )
    assert r.returncode == EX_CONFIG
    assert "stop_timeout" in r.stderr and "environment" in r.stderr


@pytest.mark.slow
def test_no_redis_url_and_no_redis_server_exits_78_with_a_hint(tmp_path: Path) -> None:
    bindir = tmp_path / "bin"  # a PATH with python but no redis-server
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    r = run_herder("--state-dir", str(tmp_path / "s"), env={"PATH": str(bindir)})
    assert r.returncode == EX_CONFIG
    assert (
        "redis_url" in r.stderr and "apt-get install redis-server" in r.stderr and "--redis-url" in r.stderr
    )


@pytest.mark.slow
def test_state_dir_too_long_for_a_socket_exits_78(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    r = run_herder("--state-dir", str(deep), "--redis-url", "redis://127.0.0.1:1/0")
    assert r.returncode == EX_CONFIG
    assert "'state_dir'" in r.stderr and "too long" in r.stderr


@pytest.mark.slow
def test_zero_workers_on_the_command_line_is_a_usage_error(tmp_path: Path) -> None:
    r = run_herder("--redis-url", "redis://127.0.0.1:1/0", "--workers", "0", "--state-dir", str(tmp_path))
    assert r.returncode == 2
    assert "--workers" in r.stderr


@pytest.mark.slow
def test_packages_named_like_herders_folders_do_not_matter(herder, jobs, tmp_path: Path) -> None:
    """supervisord's `supervisor`, the file watcher's `watchdog` and a user's `worker` module
    on the path: herder imports only `herder.*`, so none of them is touched."""
    fakes = tmp_path / "fakes"
    for name in ("supervisor", "watchdog", "worker"):
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(f"raise ImportError('not herder: {name}')\n")
    h = herder(workers="1", env={"PYTHONPATH": str(fakes)})
    h.wait_workers(1)
    job = jobs.enqueue("record", "fakes")
    wait_for(lambda: jobs.finished("fakes") == [job.id], 15, what="a job to run")
    h.stop_and_check()
    assert "not herder" not in h.log()


@pytest.fixture
def password_redis(tmp_path: Path):
    proc, port = start_redis(tmp_path, "--requirepass", "hunter2-s3cret")
    yield port
    proc.terminate()
    proc.wait(10)


@pytest.mark.slow
def test_redis_password_never_appears_in_logs(herder, password_redis: int, tmp_path: Path) -> None:
    from rq import Queue

    good = f"redis://:hunter2-s3cret@127.0.0.1:{password_redis}/0"
    h = herder(redis_url=good, workers="1")
    h.wait_workers(1)
    r = Redis.from_url(good)
    job = Queue(connection=r).enqueue("herder_testjobs.record", "pw")
    wait_for(lambda: r.llen("finished:pw") == 1, 10, what="a job on the password Redis")
    # The job herder ran is the one enqueued, done once, on the Redis that needs the password.
    assert r.lrange("finished:pw", 0, -1) == [job.id.encode()]
    wait_for(lambda: job.get_status(refresh=True) == "finished", 5, what="RQ to mark it finished")
    h.stop_and_check()
    # And with a wrong password: every error path logs, none shows the secret.
    bad = f"redis://:wrong-hunter2-s3cret@127.0.0.1:{password_redis}/0"
    h2 = herder(redis_url=bad, workers="1")
    # Its worker cannot log in, dies and is spawned again: every error path has run once.
    h2.wait_status(lambda s: s["totals"]["spawned"] >= 2, 20, what="a worker to die and be respawned")
    h2.stop_and_check()
    for log in (h.log(), h2.log()):
        assert "hunter2-s3cret" not in log
        assert ":***@127.0.0.1" in log
    assert "invalid username-password pair" in h2.log() or "AuthenticationError" in h2.log()


@pytest.mark.slow
def test_state_dir_is_private(herder, tmp_path: Path) -> None:
    h = herder(workers="1")
    h.wait_workers(1)
    mode = (h.workdir / "state").stat().st_mode & 0o777
    assert mode == 0o700
    h.stop_and_check()


def herder_config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    full_env.update(env or {})
    return subprocess.run([HERDER, "config", *args], capture_output=True, text=True, env=full_env, timeout=20)


@pytest.mark.slow
def test_file_then_environment_then_flags_later_wins_with_sources(tmp_path: Path) -> None:
    f = tmp_path / "herder.toml"
    f.write_text(
        '[herder]\nredis-url = "redis://:topsecret@db:6390/0"\nworkers = 3\nstop_timeout = 12\n'
        'queue = ["high", "low"]\n'
    )
    r = herder_config("--config", str(f), "--workers", "5", env={"HERDER_STOP_TIMEOUT": "20"})
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert "5" in rows["workers"] and "command line (--workers)" in rows["workers"]
    assert "20.0" in rows["stop_timeout"] and "environment (HERDER_STOP_TIMEOUT)" in rows["stop_timeout"]
    assert "high, low" in rows["queues"] and f"file {f}" in rows["queues"]
    assert "redis://:***@db:6390/0" in rows["redis_url"]
    assert "topsecret" not in r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("content", "key", "why"),
    [
        ("[herder]\nwokers = 3\n", "wokers", "unknown setting"),
        ("[herder]\nworkers = 'three'\n", "workers", "must be an integer"),
        ("[herder]\nstop_timeout = -1\n", "stop_timeout", "must not be negative"),
        ("[herder]\nmax_workers = 2\nmin_workers = 5\n", "min_workers", "between 0 and max_workers"),
        ("not toml = = =\n", "config", "not valid TOML"),
        ("workers = 3\n[herder]\nqueues = ['a']\n", "workers", "belongs in the [herder] table"),
    ],
)
def test_bad_config_file_exits_78_naming_key_and_file(
    tmp_path: Path, content: str, key: str, why: str
) -> None:
    f = tmp_path / "bad.toml"
    f.write_text(content)
    for command in (herder_config, run_herder):
        r = command(
            "--config", str(f), "--redis-url", "redis://127.0.0.1:1/0", "--state-dir", str(tmp_path / "s")
        )
        assert r.returncode == EX_CONFIG, (command, r.stderr)
        assert f"'{key}'" in r.stderr and why in r.stderr
        assert str(f) in r.stderr or key == "config"


@pytest.mark.slow
def test_wrong_type_in_environment_exits_78(tmp_path: Path) -> None:
    r = run_herder(
        "--state-dir",
        str(tmp_path),
        env={"HERDER_REDIS_URL": "redis://127.0.0.1:1/0", "HERDER_WORKERS": "many"},
    )
    assert r.returncode == EX_CONFIG
    assert "'workers' from environment (HERDER_WORKERS): must be an integer" in r.stderr


@pytest.mark.slow
def test_example_config_file_is_valid_and_round_trips(tmp_path: Path) -> None:
    example = herder_config("--example")
    assert example.returncode == 0
    f = tmp_path / "example.toml"
    f.write_text(example.stdout)
    r = herder_config("--config", str(f))
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
def test_an_unknown_user_exits_78_naming_where_it_came_from(tmp_path: Path) -> None:
    """`herder run` and `herder config` refuse a user that does not exist alike, and say which
    layer gave it (not "from default" for a flag)."""
    r = run_herder("--state-dir", str(tmp_path), "--user", "herder-no-such-user")
    assert r.returncode == EX_CONFIG, r.stderr
    assert "'user' from command line" in r.stderr and "herder-no-such-user" in r.stderr
    r = herder_config("--user", "herder-no-such-user")
    assert r.returncode == EX_CONFIG, r.stdout + r.stderr
    assert "'user' from command line" in r.stderr
    r = herder_config(env={"HERDER_USER": "herder-no-such-user"})
    assert r.returncode == EX_CONFIG and "'user' from environment" in r.stderr, r.stderr


@pytest.mark.slow
def test_django_settings_that_cannot_load_or_name_two_redis_servers_exit_78(tmp_path: Path) -> None:
    r = run_herder("--state-dir", str(tmp_path), env={"DJANGO_SETTINGS_MODULE": "nosuch.settings"})
    assert r.returncode == EX_CONFIG
    assert "'django_settings' from environment (DJANGO_SETTINGS_MODULE)" in r.stderr and "nosuch" in r.stderr
    pkg = tmp_path / "twodb"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "settings.py").write_text(
        "RQ_QUEUES = {'a': {'URL': 'redis://127.0.0.1:1/0'},\n"
        "             'b': {'HOST': 'elsewhere', 'PASSWORD': 's3cret'}}\n"
    )
    r = run_herder(
        "--state-dir", str(tmp_path / "s"), "--path", str(tmp_path), "--django-settings", "twodb.settings"
    )
    assert r.returncode == EX_CONFIG
    assert (
        "'redis_url' from django settings module twodb.settings" in r.stderr and "2 Redis servers" in r.stderr
    )
    assert "s3cret" not in r.stderr


def test_number_flags_show_their_kind_and_still_take_what_they_took() -> None:
    """`--help` shows a number setting as INTEGER, FLOAT, SECONDS or MiB, never TEXT; its value
    is still checked by the config's coercion (a bad one exits 78 from the environment, as from
    the file), and a plain number is all it takes."""
    import typing

    from click.testing import CliRunner

    from herder.common.config import HELP, KEYS, flag_of
    from herder.supervisor.ctl.cli import cli

    hints = typing.get_type_hints(Config)
    numbers = [k for k in KEYS if {int, float} & {hints[k], *typing.get_args(hints[k])}]
    assert "workers" in numbers and "stop_timeout" in numbers and "max_memory" in numbers
    for command in ("run", "config", "install-service"):
        text = CliRunner().invoke(cli, [command, "--help"], terminal_width=200).stdout
        shown = {line.split()[0]: line.split()[1] for line in text.splitlines() if line.startswith("  --")}
        for key in numbers:
            kinds = {"MiB"} if "in MiB" in HELP[key] else {"INTEGER", "FLOAT", "SECONDS"}
            assert shown[flag_of(key)] in kinds, (command, key)
        assert shown["--stop-timeout"] == "SECONDS" and shown["--workers"] == "INTEGER"
    clean = {k: None for k in os.environ if k.startswith("HERDER_")}
    runner = CliRunner()
    ok = runner.invoke(cli, ["config", "--stop-timeout", "45.5", "--workers", "3"], env=clean)
    assert ok.exit_code == 0 and "45.5" in ok.stdout, ok.output
    bad = runner.invoke(cli, ["config"], env={**clean, "HERDER_STOP_TIMEOUT": "30s"})
    assert bad.exit_code == EX_CONFIG and "'stop_timeout' from environment" in bad.stderr
