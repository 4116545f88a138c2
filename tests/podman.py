"""A real container runtime for tests/test_image.py and tests/test_systemd.py: podman, a Python
base image built from Debian's own packages (no image registry is needed), herder's image built
offline from a directory of wheels, and a Debian host image with systemd as its init.

Why each adjustment (docs/deploy/containers.md, "Building the image without a registry"):
- `--runtime runc` where runc is installed: crun refuses a host whose cgroups are in hybrid
  mode, runc sets cgroup v1 and v2 limits alike.
- `--ulimit` at this process's own limits: podman's defaults can exceed the host's hard
  limits, and the container then fails to start on setrlimit.
- The base is `mmdebstrap --variant=minbase` of the host's Debian suite, imported under a tag
  and reused while it exists: the first build takes half a minute, the next none.
- pip in the build reads wheels downloaded on the host for the base's own Python, so the build
  needs no network and no certificate of the host's.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "deploy" / "container" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "container" / "Dockerfile.dockerignore"
# What the base needs: python3 and its venv (herder goes into /opt/herder), groupadd/useradd
# (passwd) for the image's user, ps and kill (procps) for an operator's `podman exec`.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "procps", "passwd")
# What a user's image has on its PATH (an imported tarball has no config at all).
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CAP = 4096  # a container's open files and processes (Podman.ulimits)


class Unusable(Exception):
    """No container can run here, and why (the test skips with it, or fails in CI)."""


@dataclass
class Podman:
    exe: str
    global_args: list[str] = field(default_factory=list)

    @classmethod
    def find(cls) -> Podman:
        exe = shutil.which("podman")
        if exe is None:
            raise Unusable("no podman here (apt-get install podman runc mmdebstrap uidmap slirp4netns)")
        runc = ["--runtime", "runc"] if shutil.which("runc") else []
        p = cls(exe, runc)
        info = p.run("info", check=False, timeout=60)
        if info.returncode != 0:
            raise Unusable(f"`podman info` fails: {info.stderr.strip()[-500:]}")
        return p

    def run(
        self, *args: str, check: bool = True, timeout: float = 120, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(
            [self.exe, *self.global_args, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
        if check and r.returncode != 0:
            command = " ".join(args[:3])
            raise AssertionError(f"podman {command} ... exited {r.returncode}:\n{r.stderr[-3000:]}")
        return r

    def image_exists(self, tag: str) -> bool:
        return self.run("image", "exists", tag, check=False).returncode == 0

    @staticmethod
    def ulimits() -> list[str]:
        """Limits the host permits: this process's own, at most 4096 (runc fails to set an
        nproc of 96364 here, the host's own hard limit; a container of a few workers needs far
        fewer)."""
        out = []
        for name, which in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
            limits = resource.getrlimit(which)
            soft, hard = (CAP if n == resource.RLIM_INFINITY else min(n, CAP) for n in limits)
            out += ["--ulimit", f"{name}={soft}:{hard}"]
        return out


def host_suite_and_mirror() -> tuple[str, str]:
    """The host's Debian suite and the mirror apt already uses (bookworm and deb.debian.org
    on any other host)."""
    suite = "bookworm"
    try:
        release = Path("/etc/os-release").read_text()
        if re.search(r"^ID=debian$", release, re.M):
            found = re.search(r"^VERSION_CODENAME=(\w+)$", release, re.M)
            suite = found.group(1) if found else suite
    except OSError:
        return suite, DEFAULT_MIRROR
    sources = sorted(Path("/etc/apt").glob("sources.list.d/*.sources")) + [Path("/etc/apt/sources.list")]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        for uri in re.findall(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            found = uri[0] or uri[1]
            if found.rstrip("/").endswith("/debian"):
                return suite, found
    return suite, DEFAULT_MIRROR


def debian_image(
    podman: Podman, tag: str, packages: tuple[str, ...], timeout: float, changes: tuple[str, ...] = ()
) -> str:
    """`tag`, or a minbase root of the host's Debian suite with `packages` (mmdebstrap) imported
    under it: built once per machine, reused while the tag exists."""
    if podman.image_exists(tag):
        return tag
    suite, mirror = host_suite_and_mirror()
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise Unusable(f"no image {tag} and no mmdebstrap to build one (apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="herder-image-") as tmp:
        tar = Path(tmp) / "root.tar"
        r = subprocess.run(
            [mmdebstrap, "--quiet", "--variant=minbase", f"--include={','.join(packages)}",
             suite, str(tar), mirror],
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if r.returncode != 0:
            raise Unusable(f"mmdebstrap could not build {tag} from {mirror}: {r.stderr.strip()[-800:]}")
        change_args = [arg for change in (f"ENV PATH={BASE_PATH}", *changes) for arg in ("--change", change)]
        podman.run("import", *change_args, str(tar), tag, timeout=300)
    return tag


def base_image(podman: Podman) -> str:
    """A Python base from Debian's packages, built once per machine and reused by its tag.
    $HERDER_TEST_BASE_IMAGE names another one (python:3.12-slim, where a registry is reachable)."""
    given = os.environ.get("HERDER_TEST_BASE_IMAGE")
    if given:
        return given
    suite, _ = host_suite_and_mirror()
    return debian_image(podman, f"localhost/herder-base:{suite}", BASE_PACKAGES, timeout=600)


# PEP 508's marker environment of the base's python3, from the standard library alone.
MARKER_ENVIRONMENT = """
import json, os, platform, sys
v = platform.python_version()
print(json.dumps({
    "implementation_name": sys.implementation.name, "implementation_version": v,
    "os_name": os.name, "platform_machine": platform.machine(), "platform_release": platform.release(),
    "platform_system": platform.system(), "platform_version": platform.version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_full_version": v, "python_version": ".".join(v.split(".")[:2]), "sys_platform": sys.platform,
}))
"""


def base_markers(podman: Podman, base: str) -> dict[str, str]:
    """The base's python3 as dependency markers see it ("python_full_version": "3.11.2", ...)."""
    r = podman.run("run", "--rm", "--network", "none", *podman.ulimits(), base, "python3", "-c",
                   MARKER_ENVIRONMENT)  # fmt: skip
    return json.loads(r.stdout)


def unmet(where: Path, markers: dict[str, str]) -> list[str]:
    """Requirements of the wheels in `where` that hold on the base but have no wheel there.
    `pip download --python-version` picks wheels for the target but judges markers by this
    interpreter: redis-py needs async-timeout on Python < 3.11.3 (Debian 12's is 3.11.2), which
    a download from a newer Python leaves out."""
    present = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in where.glob("*.whl")}
    missing = []
    for wheel in sorted(where.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            # The wheel's own, at its top level (setuptools' wheel holds its vendored ones too).
            (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
            for line in z.read(metadata).decode().splitlines():
                if not line.startswith("Requires-Dist:"):
                    continue
                req = Requirement(line.partition(":")[2].strip())
                holds = req.marker is None or req.marker.evaluate({**markers, "extra": ""})
                if holds and canonicalize_name(req.name) not in present:
                    missing.append(f"{req.name}{req.specifier}")
    return missing


def wheels_for(markers: dict[str, str]) -> Path:
    """herder's build backend and runtime dependencies as wheels for the base's Python,
    downloaded once per list into the test venv (the stamp holds the list, as scripts/setup's
    does), then whatever the base's markers add."""
    with open(REPO / "pyproject.toml", "rb") as f:
        meta = tomllib.load(f)
    reqs = [*meta["build-system"]["requires"], "wheel", *meta["project"]["dependencies"]]
    version = markers["python_full_version"]
    where = Path(sys.prefix) / "image-wheels" / version
    stamp = where / ".stamp"
    wanted = "\n".join(reqs)
    if stamp.exists() and stamp.read_text() == wanted:
        return where
    for _ in range(5):  # each round adds what the last one's wheels require
        r = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
             "--only-binary=:all:", "--python-version", version, "-d", str(where), *reqs],
            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if r.returncode != 0:
            raise AssertionError(f"pip download for Python {version} failed:\n{r.stderr[-3000:]}")
        reqs = unmet(where, markers)
        if not reqs:
            stamp.write_text(wanted)
            return where
    raise AssertionError(f"wheels for Python {version} still lack {reqs}")


def build_image(podman: Podman, tag: str) -> None:
    """herder's image from this tree, on the base, with no network: what a user's
    `docker build -f deploy/container/Dockerfile .` makes, from the same Dockerfile. Docker's
    image format, as docker builds it: the OCI format has no HEALTHCHECK. No layer cache: the
    install step's key is its instruction, not the source it mounts, so a cached layer would hold
    an earlier tree's herder."""
    base = base_image(podman)
    wheels = wheels_for(base_markers(podman, base))
    podman.run(
        "build", *podman.ulimits(), "--network", "none", "--format", "docker", "--no-cache",
        "-f", str(DOCKERFILE), "--ignorefile", str(DOCKERIGNORE),
        "--build-arg", f"BASE_IMAGE={base}", "--build-arg", "PIP_NO_INDEX=1",
        "--build-arg", "PIP_FIND_LINKS=/wheels", "-v", f"{wheels}:/wheels:ro",
        "-t", tag, str(REPO),
        timeout=900,
    )  # fmt: skip


# What a host under systemd has for tests/test_systemd.py: systemd as PID 1 (systemd-sysv's
# /sbin/init, dbus for systemctl), python3 and its venv for herder in /opt/herder, Debian's
# redis-server (its own unit) for the Redis herder's unit points at, ps and kill (procps).
SYSTEMD_PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "redis-server",
                    "procps", "passwd")  # fmt: skip


def systemd_image(podman: Podman) -> str:
    """A Debian host with systemd as its init, built by mmdebstrap of the host's suite like the
    base, imported under its own tag and reused while it exists. Run it with `--systemd=always`
    and `/sbin/init`."""
    suite, _ = host_suite_and_mirror()
    tag = f"localhost/herder-systemd:{suite}"
    return debian_image(podman, tag, SYSTEMD_PACKAGES, timeout=900, changes=('CMD ["/sbin/init"]',))


UNIFIED = Path("/sys/fs/cgroup/unified")


def hybrid_cgroup2() -> Path | None:
    """Where a container's systemd can have a cgroup2 tree of its own on a host whose cgroups
    are in hybrid mode (v1 controllers, cgroup2 at /sys/fs/cgroup/unified): a new directory
    there (root only), to bind-mount at the container's /sys/fs/cgroup/unified. Without it,
    podman gives systemd cgroup v1 alone, whose release agent never reaches it in a container:
    a unit whose last processes are not systemd's own children (a main process killed first,
    then the rest) stays in `deactivating` until its stop timeout, as if they were still there.
    None on any other host (cgroup v2 alone: systemd has its own namespace there)."""
    mounts = Path("/proc/self/mounts").read_text().split("\n")
    if not any(f" {UNIFIED} cgroup2 " in line for line in mounts) or os.geteuid() != 0:
        return None
    where = UNIFIED / f"herder-test-{os.getpid()}-{os.urandom(4).hex()}"
    where.mkdir()
    return where


def remove_cgroup_tree(top: Path) -> None:
    """A cgroup directory and the ones in it, deepest first, once their processes are gone."""
    for path in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
        path.rmdir()
    top.rmdir()


def herder_wheel(wheels: Path, out: Path) -> Path:
    """herder's wheel built from this tree, offline: its build backend from `wheels`
    (wheels_for), as a user's `pip wheel .` builds it. It holds the service templates under
    share/herder."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-index", "--find-links", str(wheels), "-w", str(out), str(REPO)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if r.returncode != 0:
        raise AssertionError(f"pip wheel of herder failed:\n{r.stderr[-3000:]}")
    (wheel,) = out.glob("herder-*.whl")
    return wheel


def redis_image(podman: Podman) -> str:
    """A redis-server image for the compose file's `redis` service, where docker.io's cannot be
    pulled: Debian's redis-server on the same base, built once per machine and reused by its tag."""
    base = base_image(podman)
    tag = f"localhost/herder-test-redis:{base.rpartition(':')[2]}"
    if podman.image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="herder-redis-") as tmp:
        (Path(tmp) / "Containerfile").write_text(
            f"FROM {base}\n"
            "RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server"
            " && rm -rf /var/lib/apt/lists/*\n"
            "USER redis\n"
            'CMD ["redis-server"]\n'
        )
        podman.run("build", *podman.ulimits(), "--network", "host", "-t", tag, tmp, timeout=600)
    return tag


def remove_labelled(podman: Podman, label: str) -> None:
    """Every container, then every network, that carries `label` (key=value), whatever its state:
    a test's teardown, also after an interrupted start."""
    ids = podman.run("ps", "-aq", "--filter", f"label={label}", check=False).stdout.split()
    if ids:
        podman.run("rm", "-f", "-v", "-t", "0", *ids, check=False, timeout=120)
    networks = podman.run("network", "ls", "-q", "--filter", f"label={label}", check=False).stdout.split()
    if networks:
        podman.run("network", "rm", "-f", *networks, check=False, timeout=60)
