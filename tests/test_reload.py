"""`herder reload`: every changed key is applied, restarts the workers, or refuses the whole
reload by name, and the reply and `herder status --json` say which; through the real
`herder` command on real processes, plus the pure parts in milliseconds."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeClock, make
from harness import HERDER, JOBS_DIR, SHORT_TIMEOUT_FLAGS
from herder.common.config import (
    APPLY,
    KEYS,
    RESTART,
    WORKERS,
    Config,
    ConfigError,
    reload_plan,
    reload_policy,
)
from herder.supervisor.policy.guard import KillGuard
from herder.supervisor.policy.scaling import Load
from herder.supervisor.redis_side.load_reader import Reading

# What a reload does with each setting, written out here rather than read from the schema,
# so a setting added without deciding (or a decision changed by accident) fails this file.
POLICY = {
    APPLY: {
        "cron",  # the scheduler process restarts with it (herder.supervisor.children.scheduler.settings_of)
        "workers",
        "min_workers",
        "max_workers",
        "workers_limit",
        "scale_interval",
        "scale_down_delay",
        "drain_target",
        "max_wait",
        "on_event",
        "on_event_url",
        "on_event_timeout",
        "cluster_max_workers",
        "host_ttl",
        "job_timeout",
        "job_timeout_grace",
        "heartbeat_timeout",
        "start_timeout",
        "stop_timeout",
        "kill_timeout",
        "max_requeues",
        "kill_budget",
        "kill_budget_window",
        "min_uptime",
        "backoff_initial",
        "backoff_max",
        "sweep_interval",
        "cull_failures",
        "cull_failure_window",
        "cull_budget",
        "cull_window",
        "max_jobs",
        "max_jobs_jitter",
        "max_age",
        "max_age_jitter",
        "max_memory",
        "max_memory_hard",
        "recycle_share",
        "scheduler",
        "health_grace",
        "progress_timeout",
    },
    WORKERS: {"queues", "paths", "worker_command", "log_level", "heartbeat_interval", "redis_timeout"}
    | {"worker_class", "job_class", "queue_class", "serializer", "exception_handlers"}
    | {"disable_default_exception_handler", "results_ttl", "worker_ttl", "maintenance_interval"}
    | {"dequeue_strategy", "fork_server", "preload", "worker_nice", "fast_path", "threads"}
    | {"worker_init", "django_settings"},
    RESTART: {"redis_url", "host_id", "master_heartbeat_timeout", "max_restarts", "restart_window"}
    | {"state_dir", "user", "http", "http_token_file", "rq_config", "log_format"},
}
# harness's SHORT_TIMEOUT_FLAGS, written into the config file instead (flags pin a setting).
SHORT_TIMEOUTS_IN_FILE = {flag[2:].replace("-", "_"): float(v) for flag, v in SHORT_TIMEOUT_FLAGS.items()}
NO_SHORT_TIMEOUT_FLAGS = {key: None for key in SHORT_TIMEOUTS_IN_FILE}


def toml(settings: dict[str, Any]) -> str:
    lines = ["[herder]"]
    for key, value in settings.items():
        lines.append(f"{key} = {json.dumps(value)}")  # JSON's strings, numbers and lists are TOML's
    return "\n".join(lines) + "\n"


def herder_cli(h, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [HERDER, *args, "--state-dir", h.state_dir], capture_output=True, text=True, timeout=30
    )


def reload(h) -> dict:
    r = herder_cli(h, "reload", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def refused(h) -> str:
    r = herder_cli(h, "reload", "--json")
    assert r.returncode == 1, r.stdout
    return r.stderr


# ---- the pure parts ---------------------------------------------------------------------------


def test_every_setting_has_the_reload_policy_this_file_expects() -> None:
    expected = {key: policy for policy, keys in POLICY.items() for key in keys}
    assert {key: reload_policy(key) for key in KEYS} == expected


def test_the_stop_may_get_shorter_but_not_longer_than_the_watchdog_allows() -> None:
    started = Config(stop_timeout=30.0, kill_timeout=5.0, config_file="/etc/herder.toml")
    shorter = reload_plan(started, replace(started, stop_timeout=10.0), started)
    assert shorter.applied == ["stop_timeout"]
    with pytest.raises(ConfigError) as err:
        reload_plan(started, replace(started, stop_timeout=40.0), started)
    assert err.value.key == "stop_timeout" and "35 s the watchdog allows" in str(err.value)
    running = replace(started, kill_timeout=1.0)  # an earlier reload shortened the kill timeout
    assert reload_plan(running, replace(running, stop_timeout=34.0), started).applied == ["stop_timeout"]


def test_a_cluster_cap_changes_but_cannot_be_switched_on_or_off() -> None:
    capped = Config(max_workers=4, cluster_max_workers=8, config_file="/etc/herder.toml")
    assert reload_plan(capped, replace(capped, cluster_max_workers=12), capped).applied == [
        "cluster_max_workers"
    ]
    uncapped = replace(capped, cluster_max_workers=None)
    for before, after in ((capped, uncapped), (uncapped, capped)):
        with pytest.raises(ConfigError, match="turning the cluster cap on or off"):
            reload_plan(before, after, before)


def test_every_refused_key_is_named_at_once() -> None:
    cfg = Config(config_file="/etc/herder.toml")
    new = replace(cfg, redis_url="redis://elsewhere:6390/0", user="nobody", workers=3)
    with pytest.raises(ConfigError) as err:
        reload_plan(cfg, new, cfg)
    assert err.value.key == "redis_url, user"
    assert "only a restart of herder applies it" in str(err.value)


def test_a_new_kill_budget_window_keeps_the_kills_already_counted() -> None:
    cfg = Config(kill_budget=0.5, kill_budget_window=60.0)
    guard = KillGuard(cfg, None)
    now = 1_700_000_030.0
    assert guard.budget.take(4, now=now) and guard.budget.take(4, now=now)  # 2 of 4 x 0.5: spent
    assert not guard.budget.take(4, now=now)
    guard.configure(replace(cfg, kill_budget_window=20.0), now)
    assert guard.budget.window == 20.0
    assert not guard.budget.take(4, now=now)  # a reload does not hand out a fresh budget
    guard.configure(replace(cfg, kill_budget_window=20.0, kill_budget=1.0), now)
    assert guard.budget.take(4, now=now)  # a bigger share does


# ---- end to end ---------------------------------------------------------------------------------

APPLIED = [  # (key, new value): each reload changes one more
    ("workers", 3),
    ("workers_limit", 30),
    ("scale_interval", 0.5),
    ("scale_down_delay", 20.0),
    ("drain_target", 10.0),
    ("max_wait", 5.0),
    ("job_timeout", 60.0),
    ("job_timeout_grace", 2.0),
    ("heartbeat_timeout", 4.0),
    ("start_timeout", 25.0),
    ("stop_timeout", 10.0),
    ("kill_timeout", 0.5),
    ("max_requeues", 5),
    ("kill_budget", 0.25),
    ("kill_budget_window", 30.0),
    ("min_uptime", 0.75),
    ("backoff_initial", 0.2),
    ("backoff_max", 10.0),
]


@pytest.mark.slow
def test_reload_applies_each_changed_key_and_status_shows_it_in_force(herder, tmp_path: Path) -> None:
    conf = tmp_path / "herder.toml"
    settings: dict[str, Any] = {"workers": 2, "paths": [str(JOBS_DIR)], **SHORT_TIMEOUTS_IN_FILE}
    conf.write_text(toml(settings))
    h = herder(config=str(conf), workers=None, path=None, **NO_SHORT_TIMEOUT_FLAGS)
    first = {p.pid for p in h.wait_workers(2)}
    assert reload(h) == {"ok": True, "changed": [], "applied": [], "restart_workers": [], "replacing": 0}
    for key, value in APPLIED:
        settings[key] = value
        conf.write_text(toml(settings))
        reply = reload(h)
        assert (reply["applied"], reply["restart_workers"]) == ([key], []), key
        assert h.snapshot()["settings"][key] == value, key  # read back from the part that uses it
    st = h.snapshot()
    assert st["desired"] == 3 and st["workers_limit"] == 30
    h.wait_workers(3)
    assert first <= {p.pid for p in h.workers()}  # none of those restarted a worker

    other_jobs = tmp_path / "jobs"
    other_jobs.mkdir()
    for key, value in [
        ("queues", ["default", "extra"]),
        ("paths", [str(JOBS_DIR), str(other_jobs)]),
        ("log_level", "DEBUG"),
        ("heartbeat_interval", 0.5),
        ("worker_command", [sys.executable, "-P", "-m", "herder.worker"]),
    ]:
        settings[key] = value
        conf.write_text(toml(settings))
        reply = reload(h)
        assert (reply["applied"], reply["restart_workers"]) == ([], [key]), key
        assert reply["replacing"] >= 1
        assert h.snapshot()["settings"][key] == value, key
    h.wait_workers(3, timeout=30, without=first)  # 3 new workers
    st = h.wait_status(lambda s: s["running"], 20, what="the fleet running")
    assert {q["name"] for q in st["queues"]} == {"default", "extra"}
    h.stop_and_check()


@pytest.mark.slow
def test_reload_turns_autoscaling_on_changes_its_bounds_and_turns_it_off(herder, tmp_path: Path) -> None:
    conf = tmp_path / "herder.toml"
    conf.write_text(toml({"workers": 2, "workers_limit": 8}))
    h = herder(config=str(conf), workers=None)
    h.wait_workers(2)
    conf.write_text(toml({"workers": 2, "workers_limit": 8, "min_workers": 3, "max_workers": 4}))
    reply = reload(h)
    assert sorted(reply["applied"]) == ["max_workers", "min_workers"] and not reply["restart_workers"]
    st = h.snapshot()
    assert (st["autoscale"], st["min"], st["max"], st["desired"]) == (True, 3, 4, 3)
    h.wait_status(lambda s: s["actual"] == 3, 20, what="3 workers: the new minimum")
    conf.write_text(toml({"workers": 2, "workers_limit": 8, "min_workers": 1, "max_workers": 9}))
    assert "'max_workers'" in (err := refused(h)) and "workers limit of 8" in err
    assert (h.snapshot()["min"], h.snapshot()["max"]) == (3, 4)  # a refused reload changes nothing
    conf.write_text(toml({"workers": 1, "workers_limit": 8}))
    reply = reload(h)
    assert sorted(reply["applied"]) == ["max_workers", "min_workers", "workers"]
    st = h.snapshot()
    assert (st["autoscale"], st["min"], st["max"], st["desired"]) == (False, 1, 1, 1)
    h.wait_workers(1)  # autoscaling off
    h.stop_and_check()


@pytest.mark.slow
def test_herder_scale_outlives_a_reload_that_leaves_the_files_bounds_as_they_were(
    herder, tmp_path: Path
) -> None:
    """`herder scale` sets bounds over the file's: a reload of other settings keeps them; a
    reload that changes the file's own bounds puts the file's in force again."""
    conf = tmp_path / "herder.toml"
    conf.write_text(toml({"workers": 2, "workers_limit": 8}))
    h = herder(config=str(conf), workers=None)
    h.wait_workers(2)
    assert herder_cli(h, "scale", "4").returncode == 0
    h.wait_workers(4)
    conf.write_text(toml({"workers": 2, "workers_limit": 8, "max_requeues": 7}))
    reply = reload(h)
    assert reply["applied"] == ["max_requeues"], reply  # the scaled count is no change of the file's
    st = h.snapshot()
    assert (st["desired"], st["settings"]["workers"], st["pools"]["default"]["scaled"]) == (
        4,
        4,
        {"workers": 4},
    )
    conf.write_text(toml({"workers": 3, "workers_limit": 8, "max_requeues": 7}))
    assert reload(h)["applied"] == ["workers"]
    st = h.wait_status(lambda s: s["actual"] == 3, 20, what="the file's 3 workers in force")
    assert (st["desired"], st["pools"]["default"]["scaled"]) == (3, {})
    h.stop_and_check()


REMOVED = object()


@pytest.mark.slow
def test_a_reload_with_a_key_only_a_restart_applies_changes_nothing(
    herder, redis_url: str, tmp_path: Path
) -> None:
    conf = tmp_path / "herder.toml"
    state = tmp_path / "state"
    base = {"workers": 2, "redis_url": redis_url, "state_dir": str(state), **SHORT_TIMEOUTS_IN_FILE}
    conf.write_text(toml(base))
    h = herder(config=str(conf), workers=None, redis_url=None, state_dir=None, **NO_SHORT_TIMEOUT_FLAGS)
    h.state_dir = str(state)
    pids = {p.pid for p in h.wait_workers(2)}
    before = h.snapshot()
    for key, value in [
        ("redis_url", redis_url.rsplit("/", 1)[0] + "/1"),
        ("state_dir", str(tmp_path / "elsewhere")),
        ("state_dir", REMOVED),  # back to the default: a move all the same
        ("user", "nobody"),
        ("host_id", "elsewhere"),
        ("master_heartbeat_timeout", 30.0),
        ("max_restarts", 9),
        ("restart_window", 120.0),
        ("stop_timeout", 60.0),  # longer than the watchdog allows the stop it started with
    ]:
        changed = {**base, "workers": 3, "queues": ["default", "extra"], key: value}
        if value is REMOVED:
            del changed[key]
        conf.write_text(toml(changed))
        err = refused(h)
        assert f"'{key}'" in err and "only a restart of herder applies it" in err, err
        after = h.snapshot()
        assert after["settings"] == before["settings"] and after["desired"] == 2, key
        assert {p.pid for p in h.workers()} == pids, key  # and no worker restarted
    conf.write_text(toml({**base, "workers": 3}))
    assert reload(h)["applied"] == ["workers"]  # the rest of the file was fine all along
    h.stop_and_check()


@pytest.mark.slow
def test_reload_changes_the_cluster_cap_but_refuses_to_drop_it(herder, tmp_path: Path) -> None:
    conf = tmp_path / "herder.toml"
    capped = {"min_workers": 1, "max_workers": 2, "cluster_max_workers": 4, "host_ttl": 10.0}
    conf.write_text(toml(capped))
    h = herder(config=str(conf), workers=None)
    h.wait_workers(1)
    h.wait_status(lambda s: s["cluster_grant"] is not None, 20, what="a first cluster grant")
    conf.write_text(toml({**capped, "cluster_max_workers": 6, "host_ttl": 12.0}))
    reply = reload(h)
    assert reply["applied"] == ["cluster_max_workers", "host_ttl"]
    st = h.snapshot()
    assert st["cluster_max"] == 6
    assert (st["settings"]["cluster_max_workers"], st["settings"]["host_ttl"]) == (6, 12.0)
    conf.write_text(toml({"min_workers": 1, "max_workers": 2}))
    assert "'cluster_max_workers'" in (err := refused(h)) and "on or off" in err
    assert h.snapshot()["cluster_max"] == 6
    h.stop_and_check()


def test_autoscaling_turned_on_starts_from_the_count_running_and_waits_to_scale_down() -> None:
    clock = FakeClock()
    m, _, _ = make(clock, workers=2, scale_down_delay=30.0)

    class Reader:  # one reading of an empty queue
        def take(self) -> Reading:
            return Reading(Load(clock.t, backlog=0, running=0), None)

    m.reader = Reader()  # type: ignore[assignment]
    m.commands.rescale({"workers": 5})
    m.pool_list()[0].configure(replace(m.cfg, min_workers=1, max_workers=8))  # a reload turned it on
    assert m.target == 5
    m.scale()
    assert m.target == 5  # not back to the count herder started with, and not down at once
    clock.advance(31)
    m.scale()
    assert m.target == 1  # after the scale-down delay, as always
