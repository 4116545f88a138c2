"""Which rq, redis-py and Python herder supports (herder.common.rq_support, rq_seam), said the same
everywhere, and what a setting that needs a newer rq does on an older one: exit 78 naming the rq
it needs, before anything starts. Runs on every point of the support matrix (.ci/matrix)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import rq

from harness import HERDER
from herder.common import rq_seam, rq_support
from herder.common.config import EX_CONFIG, Config, ConfigError, validate

REPO = Path(__file__).resolve().parent.parent
RQ = rq_support.parse_version(rq.__version__)


def matrix() -> list[tuple[str, str, str, str]]:
    points = []
    for line in (REPO / ".ci" / "matrix").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            py, rq_version, redis_version, kind = line.split()[:4]
            points.append((py, rq_version, redis_version, kind))
    return points


def test_the_versions_installed_here_are_supported_ones() -> None:
    assert rq_support.support_problems() == []
    assert rq_support.installed("rq") == RQ


def test_pyproject_readme_and_the_matrix_say_the_same() -> None:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for name, (low, high) in rq_support.SUPPORTED.items():
        spec = f"{name}>={rq_support.show(low)},<{rq_support.show(high)}"
        assert spec in meta["dependencies"], spec
    pythons = sorted({p for p, *_ in matrix()}, key=rq_support.parse_version)
    newest = rq_support.parse_version(pythons[-1])
    assert meta["requires-python"] == f">={pythons[0]},<{newest[0]}.{newest[1] + 1}"
    readme = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| (3\.\d+) \| (\d[\d.]*) \| (\d[\d.]*) \| (full|contract)", readme, re.M)
    assert set(rows) == set(matrix()) and len(rows) == len(matrix())
    for py, rq_version, redis_version, _ in matrix():  # each point inside the ranges it tests
        for name, version in (("rq", rq_version), ("redis", redis_version)):
            low, high = rq_support.SUPPORTED[name]
            assert low <= rq_support.parse_version(version) < high, (py, name, version)
    # the matrix holds the lowest and highest of each, and every Python
    assert {rq_support.parse_version(r)[:2] for _, r, _, _ in matrix()} >= {(2, 12), (3, 0)}
    assert {rq_support.parse_version(r)[0] for _, _, r, _ in matrix()} >= {5, 8}
    assert set(pythons) >= {"3.11", "3.12", "3.13"}


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("2.12.0", (2, 12, 0)),
        ("3.0.0", (3, 0, 0)),
        ("3.1.0rc1", (3, 1, 0)),
        ("8.1", (8, 1)),
        ("5.0.0.post1", (5, 0, 0)),
    ],
)
def test_versions_are_read_as_their_release_numbers(text: str, version: tuple[int, ...]) -> None:
    assert rq_support.parse_version(text) == version


def test_a_setting_that_needs_rq_3_is_refused_on_rq_2_naming_the_version() -> None:
    why = rq_support.unsupported_rq_setting("fast_path", True, rq_version=(2, 12, 0))
    assert why is not None and "needs rq >= 3.0" in why and "rq 2.12.0 is installed" in why
    assert rq_support.unsupported_rq_setting("fast_path", False, rq_version=(2, 12, 0)) is None
    assert rq_support.unsupported_rq_setting("fast_path", True, rq_version=(3, 0, 0)) is None
    assert rq_support.unsupported_rq_setting("workers", 4, rq_version=(2, 12, 0)) is None


def test_the_fast_path_is_on_exactly_where_rq_has_what_it_records() -> None:
    """On rq 3 every name the fast path uses is there (a check that wrongly said otherwise would
    turn herder's fast path off in silence); on rq 2 it says why it is off."""
    missing = rq_seam.fast_path_missing()
    if RQ >= (3, 0):
        assert missing is None
    else:
        assert missing is not None and f"rq {rq.__version__}" in missing


def test_the_seams_check_finds_a_renamed_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    """An rq that renamed a method the fast path records (say, an rq 3.1): herder takes RQ's
    path and says which name, rather than failing at run time."""
    if RQ < (3, 0):
        pytest.skip(f"the fast path is off on rq {rq.__version__} anyway")
    from rq.worker import BaseWorker

    monkeypatch.delattr(BaseWorker, "_finalize_success")
    assert "_finalize_success" in (rq_seam.fast_path_missing() or "")


@pytest.mark.slow
def test_asking_for_the_fast_path_exits_78_on_an_rq_without_it(tmp_path: Path) -> None:
    """`herder run --fast-path` on rq 2: one line naming the rq it needs, exit 78, nothing started
    (on rq 3, `herder config` shows the same flag accepted)."""
    command = "run" if RQ < (3, 0) else "config"
    r = subprocess.run(
        [HERDER, command, "--fast-path", "--redis-url", "redis://127.0.0.1:1/0",
         "--state-dir", str(tmp_path)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30,
    )  # fmt: skip
    if RQ >= (3, 0):
        assert r.returncode == 0, r.stderr
        assert re.search(r"^fast_path\s+True\s+# command line", r.stdout, re.M), r.stdout
        return
    assert r.returncode == EX_CONFIG, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if "fast_path" in x]
    assert "needs rq >= 3.0" in line and f"rq {rq.__version__} is installed" in line
    assert not list(tmp_path.iterdir()) or not (tmp_path / "herder.sock").exists()


def test_a_config_file_asking_for_it_names_the_file(tmp_path: Path) -> None:
    cfg = Config(fast_path=True)
    if RQ >= (3, 0):
        validate(cfg, {"fast_path": "file herder.toml"})
        return
    with pytest.raises(ConfigError) as err:
        validate(cfg, {"fast_path": "file herder.toml"})
    assert err.value.key == "fast_path" and "needs rq >= 3.0" in str(err.value)
    validate(Config(fast_path=True))  # the default: on where it can be, quietly off elsewhere
    validate(Config(fast_path=False), {"fast_path": "command line"})


def test_this_python_is_a_supported_one() -> None:
    assert f"{sys.version_info.major}.{sys.version_info.minor}" in {p for p, *_ in matrix()}
