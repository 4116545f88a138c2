"""This process's cgroup limits: the CPU quota and memory limit a container or a Kubernetes
pod sets, which the host's own figures (CPUs, physical memory) do not show. Standard library
only (the watchdog imports common/).

Where they are: /proc/self/cgroup names this process's cgroup in each hierarchy, and
/proc/self/mountinfo says where each hierarchy is mounted and which cgroup the mount shows at
its top (its root): "/" on a host or in a cgroup namespace (where /proc/self/cgroup says "/"
too), the container's own cgroup when it is bind-mounted without one. A controller lives in one
hierarchy: a cgroup v1 mount that names it (/sys/fs/cgroup/cpu,cpuacct, /sys/fs/cgroup/memory),
else the unified cgroup v2 one. The limit that binds is the tightest over the cgroup and each
ancestor visible under the mount: Kubernetes sets one on the pod's cgroup and one on the
container's.

Every function takes the filesystem root ("/" unless a test builds a fake tree under it) and
answers None for whatever it cannot read: macOS, a host without cgroups, a cgroup outside the
mount. Nothing here raises.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# cgroup v1 says "no memory limit" with the page counter's maximum in bytes, just under 2**63
# (9223372036854771712 with 4 KiB pages); anything past 2**62 (4 EiB) is that.
V1_UNLIMITED = 2**62


@dataclass(frozen=True)
class Hierarchy:
    """Where one controller's files are for this process."""

    version: int  # 1 or 2
    path: str  # this process's cgroup, as /proc/self/cgroup names it
    dirs: tuple[Path, ...]  # its directory, then each visible ancestor's, up to the mount point

    def cgroup(self, up: int) -> str:
        """The cgroup of dirs[up]: this process's, or the ancestor `up` levels above it."""
        path = self.path
        for _ in range(up):
            path = posixpath.dirname(path)
        return path


@dataclass(frozen=True)
class Found:
    """A limit and the cgroup that sets it (the tightest one)."""

    value: float
    version: int
    cgroup: str
    dir: Path


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(root: Path) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of each cgroup mount."""
    text = _read(root / "proc/self/mountinfo") or ""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 2 or fields[sep + 1] not in ("cgroup", "cgroup2"):
            continue
        options = set(fields[sep + 3].split(",")) if len(fields) > sep + 3 else set()
        mounts.append((fields[sep + 1], _unescape(fields[3]), _unescape(fields[4]), options))
    return mounts


def _under(path: str, mount_root: str) -> str | None:
    """`path` relative to the cgroup at the top of a mount, or None when outside it."""
    if ".." in path.split("/"):  # above the namespace's root: not under any mount it has
        return None
    path, mount_root = posixpath.normpath(path), posixpath.normpath(mount_root)
    if mount_root == "/":
        return path.lstrip("/") if path.startswith("/") else None
    if path == mount_root:
        return ""
    if path.startswith(mount_root + "/"):
        return path[len(mount_root) + 1 :]
    return None


def hierarchy(controller: str, root: str | Path = "/") -> Hierarchy | None:
    """Where `controller` ("cpu", "memory")'s files are for this process, or None."""
    root = Path(root)
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            v2 = parts[2]
        else:
            v1.update((name, parts[2]) for name in parts[1].split(","))
    if controller in v1:  # bound to a v1 hierarchy, so not in the unified one
        version, path = 1, v1[controller]
        mounts = [m for m in _mounts(root) if m[0] == "cgroup" and controller in m[3]]
    elif v2 is not None:
        version, path = 2, v2
        mounts = [m for m in _mounts(root) if m[0] == "cgroup2"]
    else:
        return None
    # The mount showing the most of the tree (the shortest root) shows the most ancestors.
    for _, mount_root, mount_point, _ in sorted(mounts, key=lambda m: len(m[1])):
        rel = _under(path, mount_root)
        if rel is None:
            continue
        top = root / mount_point.lstrip("/")
        parts = [p for p in rel.split("/") if p]
        dirs = tuple(top.joinpath(*parts[:n]) for n in range(len(parts), -1, -1))
        return Hierarchy(version, posixpath.normpath(path), dirs)
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _cpu_at(version: int, d: Path) -> float | None:
    if version == 2:
        fields = (_read(d / "cpu.max") or "").split()
        if len(fields) != 2 or fields[0] == "max":
            return None
        quota, period = _int(fields[0]), _int(fields[1])
    else:
        quota, period = _int(_read(d / "cpu.cfs_quota_us")), _int(_read(d / "cpu.cfs_period_us"))
    if quota is None or period is None or quota <= 0 or period <= 0:  # v1 says -1 for none
        return None
    return quota / period


def _memory_at(version: int, d: Path) -> int | None:
    if version == 2:
        text = _read(d / "memory.max")
        value = None if text is None or text.strip() == "max" else _int(text)
    else:
        value = _int(_read(d / "memory.limit_in_bytes"))
        if value is not None and value >= V1_UNLIMITED:
            return None
    return value if value is not None and value > 0 else None


def _tightest(h: Hierarchy | None, at: Callable[[int, Path], float | None]) -> Found | None:
    if h is None:
        return None
    best = None
    for up, d in enumerate(h.dirs):
        value = at(h.version, d)
        if value is not None and (best is None or value < best.value):
            best = Found(value, h.version, h.cgroup(up), d)
    return best


def cpu_quota(root: str | Path = "/") -> Found | None:
    """The tightest CPU quota and where it is set, or None."""
    try:
        return _tightest(hierarchy("cpu", root), _cpu_at)
    except Exception:  # noqa: BLE001  (odd hosts: nothing here may stop a process starting)
        return None


def memory_max(root: str | Path = "/") -> Found | None:
    """The tightest memory limit and where it is set, or None."""
    try:
        return _tightest(hierarchy("memory", root), _memory_at)
    except Exception:  # noqa: BLE001
        return None


def cpu_limit(root: str | Path = "/") -> float | None:
    """The CPUs the quota allows (1.5 for 150000/100000), tightest over the ancestors; None if
    there is no quota or no cgroup to read."""
    found = cpu_quota(root)
    return found.value if found else None


def memory_limit(root: str | Path = "/") -> int | None:
    """The memory limit in bytes, tightest over the ancestors; None if unlimited or unreadable."""
    found = memory_max(root)
    return int(found.value) if found else None


def _working_set(version: int, d: Path) -> int | None:
    """Usage minus the inactive file cache (the kernel reclaims it first), as the kubelet
    counts it for evictions and `kubectl top`."""
    usage = _int(_read(d / ("memory.current" if version == 2 else "memory.usage_in_bytes")))
    if usage is None:
        return None
    key = "inactive_file" if version == 2 else "total_inactive_file"
    inactive = 0
    for line in (_read(d / "memory.stat") or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            inactive = _int(value) or 0
    return max(0, usage - inactive)


def memory_usage(root: str | Path = "/", limit: Found | None = None) -> int | None:
    """The working set in bytes of the cgroup whose memory limit binds (`limit`, else the
    tightest found now), or of this process's own cgroup when none is set; None if unreadable."""
    try:
        limit = limit or memory_max(root)
        if limit is not None:
            return _working_set(limit.version, limit.dir)
        h = hierarchy("memory", root)
        return _working_set(h.version, h.dirs[0]) if h else None
    except Exception:  # noqa: BLE001
        return None


def mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class Limits:
    cpu: Found | None
    memory: Found | None
    usage: int | None  # the working set of the memory limit's cgroup (or this process's)

    @property
    def cpu_limit(self) -> float | None:
        return self.cpu.value if self.cpu else None

    @property
    def memory_limit(self) -> int | None:
        return int(self.memory.value) if self.memory else None

    def describe(self) -> str:
        """ "cgroup v1 /process_api/x: CPU quota 1.0, memory 384 MiB", each limit with the
        cgroup that sets it."""
        parts: dict[str, list[str]] = {}
        if self.cpu:
            parts.setdefault(f"cgroup v{self.cpu.version} {self.cpu.cgroup}", []).append(
                f"CPU quota {round(self.cpu.value, 2)}"
            )
        if self.memory:
            used = f" (working set {mib(self.usage)})" if self.usage is not None else ""
            parts.setdefault(f"cgroup v{self.memory.version} {self.memory.cgroup}", []).append(
                f"memory {mib(self.memory.value)}{used}"
            )
        if not parts:
            return "no cgroup CPU quota or memory limit"
        return "; ".join(f"{where}: {', '.join(what)}" for where, what in parts.items())


def read(root: str | Path = "/") -> Limits:
    """The CPU quota, the memory limit and its cgroup's working set, as they are now."""
    memory = memory_max(root)
    return Limits(cpu_quota(root), memory, memory_usage(root, memory))


def memory_pressure(threshold: float = 0.9, root: str | Path = "/", limit: Found | None = None) -> str | None:
    """Why memory is short, "cgroup memory 352 MiB of 384 MiB (92%)", when the working set
    of the cgroup whose limit binds (`limit`, else the tightest found now) is at or above
    `threshold` of that limit; else None."""
    limit = limit or memory_max(root)
    usage = memory_usage(root, limit) if limit else None
    if limit is None or usage is None or usage < threshold * limit.value:
        return None
    return f"cgroup memory {mib(usage)} of {mib(limit.value)} ({usage / limit.value:.0%})"


def oom_kills(root: str | Path = "/") -> int | None:
    """The kernel's OOM kill counter of this process's own memory cgroup, where its workers
    are: the kernel counts a kill in the victim's cgroup, whichever limit it was under (a
    pod's, the container's). Its own processes only (v2: memory.events.local `oom_kill`, or
    memory.events before Linux 5.2; v1: memory.oom_control, never hierarchical): a kill in a
    neighbouring cgroup, which an ancestor's or a hierarchical counter also counts, is not
    one of its workers. None where no memory controller says."""
    h = hierarchy("memory", root)
    if h is None:
        return None
    names = ("memory.events.local", "memory.events") if h.version == 2 else ("memory.oom_control",)
    for name in names:
        text = _read(h.dirs[0] / name)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return _int(value) or 0
    return None
