"""`herder install-service`: units a service manager accepts, with herder's own timeouts."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import HERDER

pytestmark = pytest.mark.slow


def render(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HERDER, "install-service", *args], capture_output=True, text=True, timeout=30)


def test_systemd_unit_has_what_a_drain_needs_and_verifies(tmp_path: Path):
    conf = tmp_path / "herder.toml"
    conf.write_text("[herder]\nstop_timeout = 120\nkill_timeout = 5\n")
    unit = tmp_path / "herder.service"
    r = render("systemd", "--config", str(conf), "--user", "nobody", "--output", str(unit))
    assert r.returncode == 0, r.stderr
    text = unit.read_text()
    for line in (
        "Type=notify",
        "KillMode=mixed",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "User=nobody",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "ReadWritePaths=/var/lib/herder",
        "WatchdogSec=30s",
        "ExecReload=/bin/kill -HUP $MAINPID",
    ):
        assert line in text.splitlines(), line
    assert "TimeoutStopSec=140s" in text  # above the 120 s stop timeout plus the kill timeout
    assert f"--config {conf}" in text
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_watchdog_sec_grows_with_a_patient_master(tmp_path: Path):
    """herder's watchdog replaces a hung master before systemd replaces all of herder: the
    pings stop 3 heartbeats into the silence and the last may be WatchdogSec/2 old, so
    WatchdogSec/2 + 3 heartbeats stays above master_heartbeat_timeout (docs/deploy/systemd.md)."""
    for timeout, heartbeat, expected in ((15, 1, 30), (30, 1, 60), (60, 2, 114)):
        r = render(
            "systemd",
            "--master-heartbeat-timeout",
            str(timeout),
            "--heartbeat-interval",
            str(heartbeat),
            "--state-dir",
            str(tmp_path / "state"),
        )
        assert r.returncode == 0, r.stderr
        assert f"WatchdogSec={expected}s" in r.stdout.splitlines()
        assert expected / 2 + 3 * heartbeat > timeout


def test_launchd_plist_parses_with_keepalive_and_exit_timeout(tmp_path: Path):
    r = render("launchd", "--user", "nobody", "--stop-timeout", "120", "--state-dir", str(tmp_path / "st"))
    assert r.returncode == 0, r.stderr
    plist = plistlib.loads(r.stdout.encode())
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ExitTimeOut"] > 120
    assert plist["UserName"] == "nobody"
    assert plist["ThrottleInterval"] > 0
    assert plist["StandardErrorPath"] == str(tmp_path / "st" / "herder.log")
    state_dir = str(tmp_path / "st")
    assert plist["ProgramArguments"][1:] == ["run", "--state-dir", state_dir, "--stop-timeout", "120"]


def test_unknown_user_exits_78():
    r = render("systemd", "--user", "no-such-user-here")
    assert r.returncode == 78 and "'user'" in r.stderr
