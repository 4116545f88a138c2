"""herder installed from its wheel into one venv with supervisord's `supervisor` and the file
watcher's `watchdog`: all three work, and uninstalling herder leaves the other two as they were.

Everything installs offline, from the wheels scripts/setup caches in $VENV/peer-wheels. The venv
is built once for the module; the tests run in file order, and the last one uninstalls herder.
"""

from __future__ import annotations

import csv
import hashlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from harness import TESTS, clean_env, wait_for
from harness import run_clean as run
from herder.supervisor import __version__
from herder.supervisor.ctl.version import checkout_commit

pytestmark = pytest.mark.slow

REPO = TESTS.parent
PEER_WHEELS = Path(sys.prefix) / "peer-wheels"
PEERS = ("supervisor", "watchdog")

FOLDERS = ("supervisor", "worker", "watchdog", "common")

OBSERVE = """
import sys, threading
from pathlib import Path
from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

created = threading.Event()

class Handler(FileSystemEventHandler):
    def on_created(self, event):
        if Path(event.src_path).name == "hello.txt":
            created.set()

observer = Observer()
observer.schedule(Handler(), sys.argv[1])
observer.start()
try:
    Path(sys.argv[1], "hello.txt").write_text("hi")
    sys.exit(0 if created.wait(10) else "no created event within 10 s")
finally:
    observer.stop()
    observer.join(10)
"""

WHERE = """
import herder.supervisor, supervisor, watchdog
print(herder.supervisor.__file__, supervisor.__file__, watchdog.__file__)
"""

SUPERVISORD_CONF = """
[supervisord]
nodaemon = true
logfile = {dir}/supervisord.log
pidfile = {dir}/supervisord.pid

[unix_http_server]
file = {dir}/supervisor.sock

[supervisorctl]
serverurl = unix://{dir}/supervisor.sock

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[program:sleeper]
command = sleep 60
startsecs = 0
"""


def installed_as(source: str) -> str:
    """Where a module of the repository must land: under `herder`, never at the top level."""
    return "herder/" + source


def digests(site: Path, names: tuple[str, ...]) -> dict[str, str]:
    """Every file of the named top-level packages and their dist-info, with its sha256."""
    out = {}
    for top in site.iterdir():
        dist = top.name.endswith(".dist-info") and top.name.split("-")[0].lower() in names
        if top.name in names or dist:
            for f in top.rglob("*"):
                if f.is_file() and "__pycache__" not in f.parts:
                    out[str(f.relative_to(site))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


class Venv:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"
        run(sys.executable, "-m", "venv", path, cwd=path.parent)
        self.site = Path(
            self.run(
                self.python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"
            ).stdout.strip()
        )
        self.peers_before: dict[str, str] = {}

    def run(self, *argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return run(*argv, cwd=self.path, timeout=timeout)

    def pip_install(self, *what: str | Path) -> None:
        self.run(self.python, "-m", "pip", "install", "-q", "--no-index", "--find-links", PEER_WHEELS, *what)


def build_wheel(root: Path) -> Path:
    """herder's wheel, built from a copy of the checkout (so no build/ or egg-info of an earlier
    build, nor of ours, ends up in it or in the checkout), with the cached build backend."""

    def leave_out(folder: str, names: list[str]) -> set[str]:
        return {
            n
            for n in names
            if n.startswith(".")
            or n in ("__pycache__", "build", "dist", "state")
            or n.endswith(".egg-info")
            or (Path(folder, n) / "pyvenv.cfg").exists()
        }

    src = root / "src"
    shutil.copytree(REPO, src, ignore=leave_out)
    # The copy is the checkout's HEAD: its .git names the checkout's repository, so the build
    # (setup.py) finds the commit it is made from, as a build in the checkout itself would.
    gitdir = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--absolute-git-dir"], capture_output=True, text=True, timeout=30
    )
    if gitdir.returncode == 0:
        (src / ".git").write_text(f"gitdir: {gitdir.stdout.strip()}\n")
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links", PEER_WHEELS,
        "-w", root / "dist", src, cwd=root)  # fmt: skip
    (wheel,) = (root / "dist").glob("herder-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    if not (PEER_WHEELS / ".stamp").is_file():
        pytest.fail(
            f"no wheel cache at {PEER_WHEELS}: run scripts/setup with the test extra "
            '(HERDER_EXTRAS="[test]"; scripts/test does it), which downloads the wheels this test installs'
        )
    root = tmp_path_factory.mktemp("install")
    wheel = build_wheel(root)
    v = Venv(root / "venv")
    v.pip_install(*PEERS)
    v.peers_before = digests(v.site, PEERS)
    assert any(f.startswith("supervisor/") for f in v.peers_before)
    assert any(f.startswith("watchdog/") for f in v.peers_before)
    v.pip_install(wheel)
    return v


def assert_supervisord_works(venv: Venv, workdir: Path) -> None:
    assert venv.run(venv.bin / "supervisord", "--version").stdout.strip()
    venv.run(venv.python, "-c", "from supervisor.states import SupervisorStates; SupervisorStates.RUNNING")
    conf = workdir / "supervisord.conf"
    conf.write_text(SUPERVISORD_CONF.format(dir=workdir))
    proc = subprocess.Popen(
        [venv.bin / "supervisord", "-c", conf],
        env=clean_env(),
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    ctl = [venv.bin / "supervisorctl", "-c", conf]
    try:

        def sleeper_running() -> bool:
            r = subprocess.run(
                [*ctl, "status", "sleeper"], capture_output=True, text=True, env=clean_env(), cwd=workdir
            )
            return "RUNNING" in r.stdout

        wait_for(sleeper_running, 20, interval=0.2, what="supervisord to run its program")
        run(*ctl, "shutdown", cwd=workdir)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def assert_observer_works(venv: Venv, workdir: Path) -> None:
    watched = workdir / "watched"
    watched.mkdir()
    venv.run(venv.python, "-c", OBSERVE, watched, timeout=30)


def test_herder_installs_under_its_own_name_only(venv: Venv) -> None:
    (record,) = venv.site.glob("herder-*.dist-info/RECORD")
    with record.open() as f:
        owned = [row[0] for row in csv.reader(f)]
    strays = [p for p in owned if not p.startswith(("herder/", "herder-", "../"))]
    assert not strays, f"herder's wheel installs files outside herder/: {strays}"
    # Every module of the repository's folders, at its place under herder/: none forgotten.
    sources = [str(m.relative_to(REPO)) for folder in FOLDERS for m in (REPO / folder).rglob("*.py")]
    missing = [s for s in sources if installed_as(s) not in owned]
    assert not missing, f"modules missing from the wheel: {missing}"
    for sub in ("supervisor", "worker", "watchdog", "common"):
        assert (venv.site / "herder" / sub / "__init__.py").is_file()
    assert not (venv.site / "worker").exists()
    # supervisord's and the file watcher's files are untouched, byte for byte.
    assert digests(venv.site, PEERS) == venv.peers_before
    assert "SupervisorStates" in (venv.site / "supervisor" / "states.py").read_text()
    # And imports resolve to the venv, not to the checkout.
    where = venv.run(venv.python, "-c", WHERE).stdout.split()
    assert [Path(p).relative_to(venv.site).parts[0] for p in where] == ["herder", "supervisor", "watchdog"]


def test_supervisord_and_the_file_watcher_work_beside_herder(venv: Venv, tmp_path: Path) -> None:
    assert_supervisord_works(venv, tmp_path)
    assert_observer_works(venv, tmp_path)


def test_herder_run_from_the_wheel(venv: Venv, herder, jobs) -> None:
    # A development version built from a checkout names its commit; a release is its number.
    commit = checkout_commit(REPO) if ".dev" in __version__ else None
    built = f"{__version__}+g{commit}" if commit else __version__
    assert venv.run(venv.bin / "herder", "--version").stdout.startswith(f"herder {built} (rq ")
    h = herder(workers="2", executable=str(venv.bin / "herder"))
    workers = h.wait_workers(2)
    master = h.master()
    assert master is not None
    # The whole tree runs the venv's Python, with the venv's herder: the master is started as the
    # venv's python; a forked worker shows its title instead, and maps the venv's extensions.
    assert master.cmdline()[0].startswith(str(venv.path)), master.cmdline()
    for p in workers:
        mapped = {m.path for m in p.memory_maps()}
        assert any(path.startswith(str(venv.site)) for path in mapped), sorted(mapped)
    job = jobs.enqueue("record", "wheel")
    jobs.wait_finished(job.id, 15, what="the job to run")
    h.signal(signal.SIGTERM)
    assert h.wait_exit(30) == 0
    h.assert_nothing_left()


def test_uninstalling_herder_leaves_supervisor_and_watchdog_intact(venv: Venv, tmp_path: Path) -> None:
    venv.run(venv.python, "-m", "pip", "uninstall", "-y", "-q", "herder")
    assert digests(venv.site, PEERS) == venv.peers_before
    assert not list(venv.site.glob("herder-*.dist-info"))
    assert not [p for p in (venv.site / "herder").rglob("*") if p.is_file()]
    assert not (venv.bin / "herder").exists()
    assert not [p for p in (venv.path / "share" / "herder").rglob("*") if p.is_file()]
    assert_supervisord_works(venv, tmp_path)
    assert_observer_works(venv, tmp_path)
