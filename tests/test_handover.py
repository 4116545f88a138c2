"""herder.common.handover: the resolved config reaches a child on a descriptor it reads once,
never in its environment."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from herder.common import handover

CHILD = """
import json, os
from herder.common import handover
first = handover.receive()
fd = int(os.environ.get("HERDER_CONFIG_FD", "-1"))
try:
    os.fstat(%d)
    still_open = True
except OSError:
    still_open = False
print(json.dumps({"text": first, "again": handover.receive(), "var": "HERDER_CONFIG_FD" in os.environ,
                  "open": still_open}))
"""


@pytest.mark.parametrize("memfd", [True, False], ids=["memfd", "unlinked-file"])
def test_a_child_reads_its_config_once_and_keeps_neither_descriptor_nor_variable(
    memfd: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not memfd:  # as on macOS: no memfd_create
        monkeypatch.delattr(os, "memfd_create", raising=False)
    text = json.dumps({"redis_url": "redis://:pw@h/0", "big": "x" * 200_000})  # past one read
    env, fd = handover.seal({**os.environ, handover.ENV_RESOLVED: text})
    assert fd is not None and handover.ENV_RESOLVED not in env and env[handover.ENV_CONFIG_FD] == str(fd)
    try:
        info = os.fstat(fd)
        assert not os.get_inheritable(fd)  # only a child it is passed to gets it
        if not memfd:
            assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_nlink == 0  # on no path
        out = subprocess.run(
            [sys.executable, "-c", CHILD % fd], env=env, pass_fds=(fd,), capture_output=True, check=True
        )
    finally:
        os.close(fd)
    seen = json.loads(out.stdout)
    assert seen == {"text": text, "again": text, "var": False, "open": False}


def test_a_spec_without_config_starts_with_no_descriptor() -> None:
    env, fd = handover.seal({"PATH": "/bin", handover.ENV_CONFIG_FD: "9"})
    assert fd is None and env == {"PATH": "/bin"}


def test_a_forked_child_takes_its_config_into_memory_not_its_environment() -> None:
    before = handover.receive()
    try:
        env = handover.accept({"PATH": "/bin", handover.ENV_RESOLVED: '{"a": 1}'})
        assert env == {"PATH": "/bin"} and handover.receive() == '{"a": 1}'
        handover.accept({"PATH": "/bin"})  # a spec with none: nothing handed over
        assert handover.receive() is None
    finally:
        handover._received[:] = [before] if before is not None else []
