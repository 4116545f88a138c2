"""The cgroup's limits (herder.common.cgroup) and the default workers limit they bound
(herder.common.config.limits).

Unit tests read fake trees (a /proc/self/cgroup, a /proc/self/mountinfo and the cgroup files
under a tmp_path root): cgroup v2, v1 with a mount per controller, ancestors tighter than the
process's own cgroup, unlimited values, missing files, cgroup namespaces. The end-to-end test
makes a real cgroup of 1 CPU and 384 MiB, starts `herder config` inside it and reads the
workers limit it prints (root only; skipped where no cgroup is writable).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import HERDER, HERDERS, Herder, free_port, hook_command, metrics, read_events, sample, wait_for
from herder.common import cgroup
from herder.common.config import limits
from herder.supervisor.policy import pressure
from herder.supervisor.policy.pressure import BindingLimit, KernelLog, OomWatch

MiB = 2**20
V1_NONE = "9223372036854771712"  # what cgroup v1 says for "no memory limit" (4 KiB pages)


def fake_root(
    tmp_path: Path, cgroups: list[str], mounts: list[tuple[str, str, str, str]], files: dict[str, str]
) -> Path:
    """A filesystem root holding /proc/self/cgroup (`cgroups`' lines), /proc/self/mountinfo (one
    line per (fstype, mount root, mount point, super options)) and `files` (path -> content)."""
    root = tmp_path / "root"
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("".join(line + "\n" for line in cgroups))
    (root / "proc/self/mountinfo").write_text(
        "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
        "23 22 0:22 / /sys/fs/cgroup rw,nosuid shared:2 - tmpfs tmpfs ro,mode=755\n"
        + "".join(
            f"{30 + i} 23 0:{30 + i} {mroot} {point} rw,nosuid,nodev,noexec,relatime shared:{9 + i} "
            f"- {fstype} {fstype} {options}\n"
            for i, (fstype, mroot, point, options) in enumerate(mounts)
        )
    )
    for path, content in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(content + "\n")
    return root


V2_MOUNT = [("cgroup2", "/", "/sys/fs/cgroup", "rw,nsdelegate,memory_recursiveprot")]
V1_MOUNTS = [
    ("cgroup", "/", "/sys/fs/cgroup/systemd", "rw,xattr,name=systemd"),
    ("cgroup", "/", "/sys/fs/cgroup/cpu,cpuacct", "rw,cpu,cpuacct"),
    ("cgroup", "/", "/sys/fs/cgroup/memory", "rw,memory"),
    ("cgroup2", "/", "/sys/fs/cgroup/unified", "rw,nsdelegate"),  # hybrid: v2 with no controllers
]
V1_CGROUPS = ["5:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc", "1:name=systemd:/docker/abc", "0::/"]


def test_v2_each_limit_is_the_tightest_over_the_pod_and_its_container(tmp_path: Path) -> None:
    pod, c1 = "sys/fs/cgroup/kubepods/pod1", "sys/fs/cgroup/kubepods/pod1/c1"
    root = fake_root(
        tmp_path,
        ["0::/kubepods/pod1/c1"],
        V2_MOUNT,
        {
            f"{pod}/cpu.max": "200000 100000",
            f"{pod}/memory.max": str(1024 * MiB),
            f"{pod}/memory.current": str(600 * MiB),
            f"{pod}/memory.stat": f"anon {400 * MiB}\nfile {200 * MiB}\ninactive_file {100 * MiB}\n",
            f"{c1}/cpu.max": "150000 100000",  # the container's quota is the tighter
            f"{c1}/memory.max": "max",  # and the pod's memory limit binds
            f"{c1}/memory.current": str(50 * MiB),
            "sys/fs/cgroup/cpu.max": "max 100000",  # the root: no limit
        },
    )
    assert cgroup.cpu_limit(root) == 1.5
    assert cgroup.memory_limit(root) == 1024 * MiB
    assert cgroup.memory_usage(root) == 500 * MiB  # the pod's working set: usage - inactive file
    found = cgroup.read(root)
    assert (found.cpu.cgroup, found.memory.cgroup) == ("/kubepods/pod1/c1", "/kubepods/pod1")
    assert found.describe() == (
        "cgroup v2 /kubepods/pod1/c1: CPU quota 1.5; cgroup v2 /kubepods/pod1: memory 1024 MiB "
        "(working set 500 MiB)"
    )


def test_v1_reads_each_controller_from_its_own_mount_never_the_hybrid_v2_one(tmp_path: Path) -> None:
    cpu, mem = "sys/fs/cgroup/cpu,cpuacct/docker/abc", "sys/fs/cgroup/memory/docker/abc"
    root = fake_root(
        tmp_path,
        V1_CGROUPS,
        V1_MOUNTS,
        {
            f"{cpu}/cpu.cfs_quota_us": "100000",
            f"{cpu}/cpu.cfs_period_us": "100000",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000",
            f"{mem}/memory.limit_in_bytes": str(384 * MiB),
            f"{mem}/memory.usage_in_bytes": str(300 * MiB),
            # v1's own inactive_file leaves out the children's; total_inactive_file counts them
            f"{mem}/memory.stat": f"inactive_file {1 * MiB}\ntotal_inactive_file {20 * MiB}",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": V1_NONE,
            # The cpu and memory controllers are bound to v1: these must not be read.
            "sys/fs/cgroup/unified/cpu.max": "50000 100000",
            "sys/fs/cgroup/unified/memory.max": str(64 * MiB),
        },
    )
    assert cgroup.cpu_limit(root) == 1.0
    assert cgroup.memory_limit(root) == 384 * MiB
    assert cgroup.memory_usage(root) == 280 * MiB
    assert cgroup.read(root).describe() == (
        "cgroup v1 /docker/abc: CPU quota 1.0, memory 384 MiB (working set 280 MiB)"
    )
    assert cgroup.memory_pressure(root=root) is None  # 73%
    assert cgroup.memory_pressure(0.7, root) == "cgroup memory 280 MiB of 384 MiB (73%)"


def test_a_parent_tighter_than_the_process_cgroup_binds_and_its_working_set_is_read(tmp_path: Path) -> None:
    cpu, mem = "sys/fs/cgroup/cpu,cpuacct/docker", "sys/fs/cgroup/memory/docker"
    root = fake_root(
        tmp_path,
        V1_CGROUPS,
        V1_MOUNTS,
        {
            f"{cpu}/cpu.cfs_quota_us": "50000",
            f"{cpu}/cpu.cfs_period_us": "100000",
            f"{cpu}/abc/cpu.cfs_quota_us": "-1",
            f"{cpu}/abc/cpu.cfs_period_us": "100000",
            f"{mem}/memory.limit_in_bytes": str(384 * MiB),
            f"{mem}/memory.usage_in_bytes": str(362 * MiB),
            f"{mem}/memory.stat": f"total_inactive_file {10 * MiB}",
            f"{mem}/abc/memory.limit_in_bytes": str(512 * MiB),
            f"{mem}/abc/memory.usage_in_bytes": str(100 * MiB),
        },
    )
    assert cgroup.cpu_limit(root) == 0.5
    assert cgroup.memory_limit(root) == 384 * MiB
    assert cgroup.memory_usage(root) == 352 * MiB  # the parent's, whose limit binds
    assert cgroup.read(root).describe() == (
        "cgroup v1 /docker: CPU quota 0.5, memory 384 MiB (working set 352 MiB)"
    )
    assert cgroup.memory_pressure(root=root) == "cgroup memory 352 MiB of 384 MiB (92%)"
    assert cgroup.memory_pressure(0.95, root) is None


def test_the_binding_limit_is_found_once_a_while_and_its_usage_read_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The master reads memory pressure every second: the working set each time, but which
    cgroup's limit binds (mountinfo parsed, every level read) only every LIMIT_EVERY."""
    mem = "sys/fs/cgroup/memory/docker"
    root = fake_root(
        tmp_path,
        V1_CGROUPS,
        V1_MOUNTS,
        {
            f"{mem}/memory.limit_in_bytes": str(384 * MiB),
            f"{mem}/memory.usage_in_bytes": str(100 * MiB),
            f"{mem}/abc/memory.limit_in_bytes": str(512 * MiB),
        },
    )
    finds = []

    def find() -> cgroup.Found | None:
        finds.append(1)
        return cgroup.memory_max(root)

    clock = [1000.0]
    monkeypatch.setattr(pressure.time, "monotonic", lambda: clock[0])
    limit = BindingLimit(find)
    assert limit.pressure() is None
    (root / mem / "memory.usage_in_bytes").write_text(str(370 * MiB))
    clock[0] += 1
    assert limit.pressure() == "cgroup memory 370 MiB of 384 MiB (96%)"  # the usage, read again
    assert len(finds) == 1
    (root / mem / "memory.limit_in_bytes").write_text(str(1024 * MiB))  # the limit raised...
    clock[0] += pressure.LIMIT_EVERY - 2
    assert limit.pressure() is not None and len(finds) == 1
    clock[0] += 1
    assert limit.pressure() is None and len(finds) == 2  # ... found again


@pytest.mark.parametrize("version", [1, 2])
def test_unlimited_values_are_none_and_the_usage_is_the_process_own_cgroup(
    tmp_path: Path, version: int
) -> None:
    if version == 2:
        d = "sys/fs/cgroup/system.slice/herder.service"
        cgroups, mounts = ["0::/system.slice/herder.service"], V2_MOUNT
        files = {
            f"{d}/cpu.max": "max 100000",
            f"{d}/memory.max": "max",
            f"{d}/memory.current": str(70 * MiB),
            f"{d}/memory.stat": f"inactive_file {5 * MiB}",
        }
    else:
        cpu, d = "sys/fs/cgroup/cpu,cpuacct/docker/abc", "sys/fs/cgroup/memory/docker/abc"
        cgroups, mounts = V1_CGROUPS, V1_MOUNTS
        files = {
            f"{cpu}/cpu.cfs_quota_us": "-1",
            f"{cpu}/cpu.cfs_period_us": "100000",
            f"{d}/memory.limit_in_bytes": V1_NONE,
            "sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**63 - 65536),  # 64 KiB pages
            f"{d}/memory.usage_in_bytes": str(70 * MiB),
            f"{d}/memory.stat": f"total_inactive_file {5 * MiB}",
        }
    root = fake_root(tmp_path, cgroups, mounts, files)
    assert (cgroup.cpu_limit(root), cgroup.memory_limit(root)) == (None, None)
    assert cgroup.memory_usage(root) == 65 * MiB
    assert cgroup.read(root).describe() == "no cgroup CPU quota or memory limit"
    assert cgroup.memory_pressure(0.0, root) is None  # no limit, no pressure


def test_missing_or_garbled_files_read_as_none_and_never_raise(tmp_path: Path) -> None:
    empty = tmp_path / "empty"  # macOS, or a host without /proc
    empty.mkdir()
    assert cgroup.read(empty) == cgroup.Limits(None, None, None)
    assert cgroup.memory_pressure(0.0, empty) is None
    assert cgroup.read(tmp_path / "nowhere").describe() == "no cgroup CPU quota or memory limit"

    # A cgroup named in /proc/self/cgroup whose hierarchy is not mounted.
    root = fake_root(tmp_path / "a", ["0::/x"], [], {"sys/fs/cgroup/x/cpu.max": "100000 100000"})
    assert cgroup.read(root) == cgroup.Limits(None, None, None)

    # Mounted, but the files are missing (controllers not enabled), empty or garbled.
    mem = "sys/fs/cgroup/memory/docker/abc"
    root = fake_root(
        tmp_path / "b",
        V1_CGROUPS,
        V1_MOUNTS,
        {
            "sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "100000",  # no period
            f"{mem}/memory.limit_in_bytes": "lots",
            "sys/fs/cgroup/memory/docker/memory.limit_in_bytes": "",
            f"{mem}/memory.stat": "total_inactive_file many",
        },
    )
    assert cgroup.read(root) == cgroup.Limits(None, None, None)
    (root / mem / "memory.usage_in_bytes").write_text(f"{10 * MiB}\n")
    assert cgroup.memory_usage(root) == 10 * MiB  # an unreadable stat subtracts nothing

    # Lines a parser could trip on: a short mountinfo line, a cgroup line without colons.
    (root / "proc/self/mountinfo").write_text("1 2 3\n" + (root / "proc/self/mountinfo").read_text())
    (root / "proc/self/cgroup").write_text("garbage\n" + (root / "proc/self/cgroup").read_text())
    assert cgroup.memory_usage(root) == 10 * MiB


@pytest.mark.parametrize(
    ("cgroups", "mount_root", "visible"),
    [
        # A cgroup namespace (Docker's default on v2): the process's cgroup is "/", and so is
        # the mount's; the files at the mount point are the container's.
        (["0::/"], "/", ["/"]),
        # No namespace, the container's cgroup bind-mounted at /sys/fs/cgroup: the mount's
        # root is the cgroup's path, and its ancestors are not visible.
        (["0::/kubepods/pod1/c1"], "/kubepods/pod1/c1", ["/kubepods/pod1/c1"]),
        # A mount of the pod's cgroup shows the pod's limits too.
        (["0::/kubepods/pod1/c1"], "/kubepods/pod1", ["/kubepods/pod1/c1", "/kubepods/pod1"]),
    ],
)
def test_a_mount_whose_root_is_a_cgroup_is_read_from_its_mount_point(
    tmp_path: Path, cgroups: list[str], mount_root: str, visible: list[str]
) -> None:
    top = "sys/fs/cgroup"
    own = Path(top, *[p for p in visible[0][len(mount_root) :].split("/") if p])
    files = {f"{own}/cpu.max": "100000 100000", f"{top}/memory.max": str(256 * MiB)}
    root = fake_root(tmp_path, cgroups, [("cgroup2", mount_root, "/sys/fs/cgroup", "rw")], files)
    h = cgroup.hierarchy("cpu", root)
    assert [h.cgroup(up) for up in range(len(h.dirs))] == visible
    assert h.dirs[-1] == root / top
    assert cgroup.cpu_limit(root) == 1.0
    assert cgroup.memory_limit(root) == 256 * MiB
    assert cgroup.read(root).memory.cgroup == visible[-1]


@pytest.mark.parametrize("path", ["/other/c2", "/../../outside"])
def test_a_cgroup_outside_every_mount_reads_as_none(tmp_path: Path, path: str) -> None:
    """The process's cgroup is not under the mount (a mount from another namespace, or a
    process outside its namespace's root): nothing to read, rather than a stranger's files."""
    root = fake_root(
        tmp_path,
        [f"0::{path}"],
        [("cgroup2", "/kubepods/pod1", "/sys/fs/cgroup", "rw")],
        {"sys/fs/cgroup/cpu.max": "100000 100000", "sys/fs/cgroup/outside/cpu.max": "100000 100000"},
    )
    assert cgroup.hierarchy("cpu", root) is None
    assert cgroup.cpu_limit(root) is None


def test_mountinfo_escapes_in_a_mount_point_are_read(tmp_path: Path) -> None:
    root = fake_root(
        tmp_path,
        ["0::/a b"],
        [("cgroup2", "/", r"/sys/fs/my\040cgroup", "rw")],
        {"sys/fs/my cgroup/a b/memory.max": str(128 * MiB)},
    )
    assert cgroup.memory_limit(root) == 128 * MiB


def test_the_oom_kill_counter_is_of_the_cgroups_own_processes(tmp_path: Path) -> None:
    """v2's memory.events.local (memory.events on a kernel without it) and v1's
    memory.oom_control, of this process's own cgroup: the kernel counts a kill in the victim's
    cgroup, whichever limit it was under. A kill in a neighbour (a sibling container, a child
    cgroup) moves the pod's counter and a hierarchical one, and is not one of its workers."""
    pod, c1 = "sys/fs/cgroup/kubepods/pod1", "sys/fs/cgroup/kubepods/pod1/c1"
    events = "low 0\nhigh 0\nmax 3\noom {}\noom_kill {}\noom_group_kill 0"
    files = {
        f"{c1}/memory.events.local": events.format(1, 1),
        f"{c1}/memory.events": events.format(3, 3),  # and two in a child cgroup of its own
        f"{pod}/memory.events": events.format(5, 5),  # and two more in a sibling container
    }
    root = fake_root(tmp_path, ["0::/kubepods/pod1/c1"], V2_MOUNT, files)
    assert cgroup.oom_kills(root) == 1
    del files[f"{c1}/memory.events.local"]  # before Linux 5.2: the one file, local then
    assert cgroup.oom_kills(fake_root(tmp_path / "old", ["0::/kubepods/pod1/c1"], V2_MOUNT, files)) == 3
    mem = "sys/fs/cgroup/memory/docker/abc"
    v1 = fake_root(tmp_path / "v1", V1_CGROUPS, V1_MOUNTS,
                   {f"{mem}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1"})  # fmt: skip
    assert cgroup.oom_kills(v1) == 1
    assert cgroup.oom_kills(fake_root(tmp_path / "none", ["0::/"], V2_MOUNT, {})) is None


def test_the_kernel_log_names_the_pids_its_oom_killer_killed_since_herder_started(tmp_path: Path) -> None:
    """/dev/kmsg's records, read without blocking: a kill before the master started is not its
    own; in a container's pid namespace the log's pids are the host's, so it is not read."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_bytes(b"3,1,1,-;Memory cgroup out of memory: Killed process 41 (herder-worker) total-vm:1kB\n")
    log = KernelLog(str(kmsg), pid_namespace=lambda: KernelLog.INIT_PID_NAMESPACE)
    with open(kmsg, "ab") as f:
        f.write(b"6,2,2,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=herder-worker,pid=42,uid=0\n")
        f.write(b"3,3,3,-;Memory cgroup out of memory: Killed process 42 (herder-worker) total-vm:1kB\n")
    assert not log.oom_killed(41) and not log.oom_killed(43)
    watch = OomWatch(read=lambda: 0, kernel_log=log)  # the counter did not move: the log says
    assert watch.killed(42) and not watch.killed(43)
    assert not watch.killed(42)  # said once: the pid's next process is another
    assert OomWatch(read=iter([0, 1]).__next__).killed(43)  # no log: the counter says
    assert KernelLog(str(kmsg), pid_namespace=lambda: "pid:[4026532999]").fd is None
    assert not KernelLog(str(tmp_path / "absent")).oom_killed(42)


# -- the default workers limit ------------------------------------------------------------------


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """An 8-CPU, 16 GiB host whose cgroup limits a test sets: host(cpu, memory)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(os, "sysconf", {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 4 * 2**20}.__getitem__)

    def limited(cpu: float | None, memory: int | None) -> tuple[int, str]:
        monkeypatch.setattr(cgroup, "cpu_limit", lambda root="/": cpu)
        monkeypatch.setattr(cgroup, "memory_limit", lambda root="/": memory)
        return limits.default_workers_limit.__wrapped__()

    return limited


def test_the_default_workers_limit_is_bounded_by_the_cgroup_and_says_so(host) -> None:  # noqa: ANN001
    assert host(None, None) == (128, "min(16 x 8 CPUs, 16.0 GiB / 64 MiB = 256)")
    assert host(1.0, 384 * MiB) == (
        6,
        "min(16 x 1 CPUs (cgroup CPU quota 1.0), 384 MiB (cgroup memory limit) / 64 MiB = 6)",
    )
    assert (limits.host_cpus(), limits.host_memory()) == (1, 384 * MiB)
    # A fraction of a CPU is one; 2.5 is 3; a quota or a limit above the host's does not bind.
    assert host(0.2, None) == (16, "min(16 x 1 CPUs (cgroup CPU quota 0.2), 16.0 GiB / 64 MiB = 256)")
    assert host(2.5, 64 * 2**30) == (48, "min(16 x 3 CPUs (cgroup CPU quota 2.5), 16.0 GiB / 64 MiB = 256)")
    assert host(16.0, 2 * 2**30) == (32, "min(16 x 8 CPUs, 2.0 GiB (cgroup memory limit) / 64 MiB = 32)")
    assert host(None, 32 * MiB)[0] == 1  # never 0


# -- end to end: herder in a real cgroup --------------------------------------------------------

# A process can move itself: write its pid into each cgroup's cgroup.procs, then exec.
MOVE_AND_EXEC = (
    "import os, sys\n"
    "end = sys.argv.index('--')\n"
    "for procs in sys.argv[1:end]:\n"
    "    with open(procs, 'w') as f:\n"
    "        f.write(str(os.getpid()))\n"
    "os.execv(sys.argv[end + 1], sys.argv[end + 1:])\n"
)


@pytest.fixture
def limited_cgroup() -> Iterator[list[Path]]:
    """A new cgroup of 1 CPU (quota 100000 per 100000 us) and 384 MiB below this process's own,
    in the cpu and the memory controllers' hierarchies (v1 or v2): their directories. Removed
    after the test, once the processes in it have exited."""
    if os.geteuid() != 0:
        pytest.skip("making a cgroup needs root")
    name = f"herder-test-{uuid.uuid4().hex[:8]}"
    made: list[Path] = []
    enabled: list[tuple[Path, str]] = []  # v2 controllers this fixture enabled for children
    try:
        for controller in ("cpu", "memory"):
            h = cgroup.hierarchy(controller)
            if h is None:
                pytest.skip(f"no {controller} cgroup hierarchy mounted for this process")
            d = h.dirs[0] / name
            try:
                if h.version == 2:
                    control = h.dirs[0] / "cgroup.subtree_control"
                    if controller not in control.read_text().split():
                        control.write_text(f"+{controller}")
                        enabled.append((control, controller))
                if d not in made:
                    d.mkdir()
                    made.append(d)
                if controller == "cpu" and h.version == 2:
                    (d / "cpu.max").write_text("100000 100000")
                elif controller == "cpu":
                    (d / "cpu.cfs_period_us").write_text("100000")
                    (d / "cpu.cfs_quota_us").write_text("100000")
                elif h.version == 2:
                    (d / "memory.max").write_text(str(384 * MiB))
                else:
                    (d / "memory.limit_in_bytes").write_text(str(384 * MiB))
            except OSError as e:
                pytest.skip(f"cannot make a cgroup v{h.version} limiting {controller} in {h.dirs[0]}: {e}")
        yield made
    finally:
        left = []
        for d in reversed(made):
            deadline = time.monotonic() + 10
            while d.exists():
                try:
                    d.rmdir()
                except OSError as e:
                    if time.monotonic() > deadline:
                        left.append(f"{d}: {e}")
                        break
                    time.sleep(0.05)  # the kernel frees an emptied cgroup shortly after its last exit
        for control, controller in enabled:
            try:
                control.write_text(f"-{controller}")
            except OSError as e:
                left.append(f"{control}: -{controller}: {e}")
        assert not left, f"cgroups left behind: {left}"


def run_in(cgroups: list[Path], *argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    procs = [str(d / "cgroup.procs") for d in cgroups]
    return subprocess.run(
        [sys.executable, "-c", MOVE_AND_EXEC, *procs, "--", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


@pytest.mark.slow
def test_herder_in_a_cgroup_of_1_cpu_and_384_mib_defaults_to_6_workers(limited_cgroup: list[Path]) -> None:
    r = run_in(limited_cgroup, HERDER, "config")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    row = rows["workers_limit"]
    assert row.split()[1] == "6", row
    assert "16 x 1 CPUs (cgroup CPU quota 1.0)" in row and "384 MiB (cgroup memory limit)" in row, row


@pytest.mark.slow
def test_the_working_set_in_a_real_cgroup_shows_as_memory_pressure(limited_cgroup: list[Path]) -> None:
    """The kernel's own memory.usage_in_bytes / memory.current and memory.stat, read for the
    cgroup whose limit binds: 200 MiB touched in 384 MiB is past half of it."""
    code = (
        "from herder.common import cgroup\n"
        "print(cgroup.memory_pressure(0.5))\n"
        "held = b'x' * (200 * 2**20)\n"  # every page written
        "print(cgroup.memory_pressure(0.5))\n"
        "print(cgroup.read().describe())\n"
    )
    r = run_in(limited_cgroup, sys.executable, "-c", code)
    assert r.returncode == 0, r.stderr
    before, after, described = r.stdout.splitlines()
    assert before == "None"
    m = re.fullmatch(r"cgroup memory (\d+) MiB of 384 MiB \((\d+)%\)", after)
    assert m and int(m[1]) >= 200 and int(m[2]) >= 52, after
    assert "CPU quota 1.0" in described and "memory 384 MiB (working set" in described, described
    assert limited_cgroup[0].name in described, described  # the cgroup that sets the limits


@pytest.mark.slow
def test_a_worker_the_kernels_oom_killer_ends_is_named_as_such(
    limited_cgroup: list[Path], herder, redis_url: str, conn, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """herder in a cgroup of 384 MiB, a job that holds 600 MB: the kernel's OOM killer SIGKILLs
    its worker. herder sent no signal, and the cgroup's OOM kill counter moved: the exit line,
    the `worker_died` event and herder_kills_total{reason="oom"} say the OOM killer did it."""
    from rq import Queue

    command, out = hook_command(tmp_path)
    port = free_port()
    workdir = tmp_path / "herder"
    workdir.mkdir()
    args = {"--workers": "1", "--on-event": command, "--http": str(port), "--max-requeues": "0"}
    h = Herder(redis_url, workdir, uuid.uuid4().hex, args)  # type: ignore[arg-type]
    request.node.stash[HERDERS].append(h)  # the herder fixture's clean-up ends it, whatever happens
    procs = [str(d / "cgroup.procs") for d in limited_cgroup]
    h.argv = [sys.executable, "-c", MOVE_AND_EXEC, *procs, "--", *h.argv]  # herder runs inside it
    h.start()
    (first,) = h.wait_workers(1, timeout=30)
    Queue("default", connection=conn).enqueue("herder_testjobs.leak", "oom", 600)
    died = wait_for(lambda: [e for e in read_events(out) if e["event"] == "worker_died"], 30,
                    what="worker_died for the OOM kill")  # fmt: skip
    assert died[0]["pid"] == first.pid and died[0]["oom"] is True and died[0]["signal"] == "SIGKILL", died
    assert f"pid {first.pid}: busy -> exited (killed by the kernel's OOM killer (SIGKILL);" in h.log()
    wait_for(  # /metrics serves what the loop last published: a moment after the event
        lambda: (
            sample(metrics(f"http://127.0.0.1:{port}"), "herder_kills_total", reason="oom", pool="default")
            == 1
        ),
        10,
        what='herder_kills_total{reason="oom"} at 1',
    )
    h.stop_and_check()
