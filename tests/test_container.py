"""The image and the Kubernetes manifests (deploy/container, deploy/kubernetes).

- The manifests parse, and every figure in them agrees with herder's own settings: the
  ConfigMap's herder.toml passes `herder config` with the environment the pod gets, the
  probes reach the HTTP endpoint the file configures, the grace period outlasts the drain,
  KEDA's trigger names a gauge herder serves with the threshold of one pod's workers.
- The Dockerfile runs `herder run` as a non-root user, and its build context (the
  Dockerfile.dockerignore allowlist) holds what `pip install` of the source needs.
- The entrypoint as PID 1 of a PID namespace, as in a pod: the watchdog is PID 1, reaps an
  orphan re-parented to it, and a SIGTERM drains (the running job finishes), exit 0.
- The image itself, built and run by podman: tests/test_image.py; the Deployment played by
  `podman kube play`: tests/test_kube.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from harness import (
    HERDER,
    HERDERS,
    SECRET_PLACEHOLDER,
    TAG_VAR,
    Herder,
    free_port,
    http_status,
    image_uid,
    instruction,
    tagged,
    wait_for,
)
from herder.common import config as settings
from herder.common.config import limits
from herder.supervisor.ctl import service

REPO = Path(__file__).resolve().parents[1]
CONTAINER = REPO / "deploy" / "container"
DOCKERIGNORE = CONTAINER / "Dockerfile.dockerignore"
KUBERNETES = REPO / "deploy" / "kubernetes"
METRICS_SOURCE = REPO / "supervisor" / "views" / "prometheus.py"  # /metrics' renderer

# The gauge KEDA scales on: "the workers this pool's queues call for across the cluster,
# before this host's caps" (every pod reports the same figure, read from Redis).
WANTED_METRIC = "herder_workers_wanted"
# The watchdog SIGKILLs a master still running this long past the drain (watchdog/entry.py:
# stop_grace = drain_seconds + 10): the pod's grace period must leave room for it.
WATCHDOG_BACKSTOP = 10.0


# ---- reading the files ------------------------------------------------------------------


def manifests() -> dict[str, dict[str, Any]]:
    """Every document in deploy/kubernetes/*.yaml, by kind (one of each)."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            assert doc["kind"] not in docs, f"two {doc['kind']}s in deploy/kubernetes"
            docs[doc["kind"]] = doc
    return docs


def pod_spec() -> dict[str, Any]:
    return manifests()["Deployment"]["spec"]["template"]["spec"]


def container() -> dict[str, Any]:
    (c,) = pod_spec()["containers"]
    return c


def exec_form(text: str) -> list[str]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None  # shell form: /bin/sh -c would be PID 1
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {text}"
    return value


def image_env() -> dict[str, str]:
    env = {}
    for rest in instruction("ENV"):
        for item in shlex.split(rest):
            key, sep, value = item.partition("=")
            assert sep, f"ENV {rest}: write KEY=VALUE"
            env[key] = value
    return env


def config_path_in_pod() -> str:
    args = container()["args"]
    return args[args.index("--config") + 1]


def write_config(tmp_path: Path) -> Path:
    """The ConfigMap's herder.toml, as the pod sees it mounted."""
    configmap = manifests()["ConfigMap"]
    assert configmap["metadata"]["name"] == volume("config")["configMap"]["name"]
    path = tmp_path / Path(config_path_in_pod()).name
    path.write_text(configmap["data"][path.name])
    return path


def volume(name: str) -> dict[str, Any]:
    (v,) = [v for v in pod_spec()["volumes"] if v["name"] == name]
    return v


def pod_env(redis_url: str = SECRET_PLACEHOLDER) -> dict[str, str]:
    """The HERDER_* variables the container gets: the image's ENV, then the Deployment's env
    (the Secret's value replaced by `redis_url`)."""
    env = {k: v for k, v in image_env().items() if k.startswith("HERDER_")}
    for item in container().get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            assert "secretKeyRef" in item["valueFrom"], f"{item['name']}: only Secrets expected"
            env[item["name"]] = redis_url
    return env


def clean_environ(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without any HERDER_* of its own, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERDER_")}
    return env | extra


def resolve(config: Path, env: dict[str, str]) -> settings.Config:
    """The Config herder makes of the file and the environment (the numbers the manifests must
    agree with); `herder config` itself runs in test_configmap_passes_herders_own_check."""
    given = {}
    for key in settings.KEYS:
        name = settings.env_of(key)
        if name in env:
            value: object = env[name].split() if settings.repeatable(key) else env[name]
            given[key] = (value, f"environment ({name})")
    cfg, _ = settings.resolve([settings.load_file(str(config)), given])
    return cfg


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity: "500m" CPU, "1Gi" memory, "2"."""
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 1e3, "M": 1e6, "G": 1e9}
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert m, f"not a quantity: {text}"
    return float(m[1]) * units.get(m[2], 1)


def run_help() -> str:
    r = subprocess.run([HERDER, "run", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def keda_trigger() -> tuple[dict[str, Any], str, str]:
    """The prometheus trigger, its metric name and its pool."""
    (trigger,) = manifests()["ScaledObject"]["spec"]["triggers"]
    m = re.fullmatch(r'max\((\w+)\{pool="(\w+)"[^}]*\}\)', trigger["metadata"]["query"].strip())
    assert m, f"the query should be max(<metric>{{pool=...}}): {trigger['metadata']['query']}"
    return trigger, m[1], m[2]


# ---- the manifests agree with herder ------------------------------------------------------


def test_manifests_parse_and_name_each_other() -> None:
    docs = manifests()
    assert set(docs) == {"ConfigMap", "Deployment", "Service", "ScaledObject"}
    deployment = docs["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    assert docs["ScaledObject"]["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]


@pytest.mark.slow
def test_manifests_are_valid_kubernetes_objects_for_every_version_the_validator_ships() -> None:
    """Each built-in object against the API's own schema, strictly (an unknown or misspelt
    field fails), offline: kubernetes-validate ships the schemas of Kubernetes 1.25 on. KEDA's
    ScaledObject is a custom resource none of them knows, and no package on the registries
    ships KEDA's CRD schema: its fields are checked by the tests below."""
    import kubernetes_validate
    from kubernetes_validate.utils import all_versions

    versions = sorted(set(all_versions()), key=lambda v: tuple(map(int, v.split("."))))
    assert len(versions) >= 6, versions
    checked = {kind: doc for kind, doc in manifests().items() if kind != "ScaledObject"}
    assert set(checked) == {"ConfigMap", "Deployment", "Service"}
    for version in versions:
        for kind, doc in checked.items():
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                why = str(exc).splitlines()[0]
                raise AssertionError(f"not a valid {kind} for Kubernetes {version}: {why}") from None


@pytest.mark.slow
def test_configmap_passes_herders_own_check(tmp_path: Path) -> None:
    """`herder config` (which resolves and validates as `herder run` does, exit 78 on any bad
    key or value) accepts the pod's command line and environment."""
    config = write_config(tmp_path)
    args = [str(config) if a == config_path_in_pod() else a for a in container()["args"]]
    r = subprocess.run(
        [HERDER, "config", *args], capture_output=True, text=True, timeout=60, env=clean_environ(pod_env())
    )
    assert r.returncode == 0, f"herder config exited {r.returncode}: {r.stderr}"
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert "# environment (HERDER_REDIS_URL)" in rows["redis_url"]
    assert "secret-from-the-Secret" not in r.stdout  # redacted
    assert f"# file {config}" in rows["http"]
    assert "# environment (HERDER_STATE_DIR)" in rows["state_dir"]


@pytest.mark.slow
def test_container_args_and_env_are_herder_run_options() -> None:
    help_text = run_help()
    flags = set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", help_text))
    variables = set(re.findall(r"env\s+var:\s+(HERDER_[A-Z0-9_]+)", help_text))
    (cmd,) = instruction("CMD")
    for arg in container()["args"] + exec_form(cmd):
        if arg.startswith("-"):
            assert arg in flags, f"{arg} is not a `herder run` option"
    for name in pod_env():
        assert name in variables, f"{name} is not a variable `herder run` reads"


def test_probes_reach_the_http_endpoint_the_config_serves(tmp_path: Path) -> None:
    cfg = resolve(write_config(tmp_path), pod_env())
    host, port = settings.http_address(cfg.http)
    # A probe comes in at the pod's IP: loopback would refuse it.
    assert host in ("0.0.0.0", "::"), f"http binds {host}: the kubelet could not reach it"
    c = container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = c[kind]["httpGet"]
        assert probe["path"] == "/healthz", kind
        # By number: `podman kube play` before podman 4.7 reads a port's name as 0 (test_kube.py).
        assert isinstance(probe["port"], int), f"{kind} names its port: podman 4.3 would probe port 0"
        assert ports.get(probe["port"], probe["port"]) == port, f"{kind} probes another port than {port}"
    svc = manifests()["Service"]
    (svc_port,) = svc["spec"]["ports"]
    assert ports.get(svc_port["targetPort"], svc_port["targetPort"]) == port
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == str(port)
    assert svc["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


def test_grace_period_outlasts_the_drain(tmp_path: Path) -> None:
    cfg = resolve(write_config(tmp_path), pod_env())
    grace = pod_spec()["terminationGracePeriodSeconds"]
    # The longest drain of any pool, then the watchdog's own backstop past it.
    assert grace >= cfg.drain_seconds + WATCHDOG_BACKSTOP, (grace, cfg.drain_seconds)
    assert grace >= service.stop_budget(cfg)  # what `herder install-service systemd` gives systemd
    # A draining pod answers 503 ("stopping"): liveness must not judge it dead meanwhile.
    live = container()["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > grace
    # A job within its own limit (job_timeout + grace, then herder kills it) is never cut
    # short by a drain.
    for name, pool in settings.pool_configs(cfg).items():
        assert pool.stop_timeout >= pool.job_timeout + pool.job_timeout_grace, name


def test_the_podman_commands_in_the_docs_name_the_manifests_objects() -> None:
    """docs/deploy/containers.md, "Trying the manifests with podman": the secret, the pod's and
    container's names as podman makes them, the grace period given by hand and the ConfigMap's
    volume are the manifests' own (tests/test_kube.py runs the same commands)."""
    text = (REPO / "docs" / "deploy" / "containers.md").read_text()
    section = text.split("## Trying the manifests with podman", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    spec, c = pod_spec(), container()
    (secret,) = [e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e]
    pod = f"{manifests()['Deployment']['metadata']['name']}-pod-0"  # one pod: no `replicas`
    expected = [
        f'printf \'{{"{secret["key"]}": "%s"}}\'',
        f"podman secret create {secret['name']} -",
        "podman kube play --configmap deploy/kubernetes/configmap.yaml deploy/kubernetes/deployment.yaml",
        f"podman stop -t {spec['terminationGracePeriodSeconds']} {pod}-{c['name']}",
        "podman kube down deploy/kubernetes/deployment.yaml",
        f"podman secret rm {secret['name']} && podman volume rm {volume('config')['configMap']['name']}",
    ]
    for line in expected:
        assert line in block, f"the docs' podman commands should say: {line}"


def test_keda_scales_on_the_wanted_gauge_by_one_pods_workers(tmp_path: Path) -> None:
    cfg = resolve(write_config(tmp_path), pod_env())
    trigger, metric, pool_name = keda_trigger()
    assert trigger["type"] == "prometheus"
    assert metric == WANTED_METRIC
    # AverageValue: replicas = ceil(metric / threshold); the metric is cluster-wide, the
    # threshold what one pod holds.
    assert trigger["metricType"] == "AverageValue"
    pools = settings.pool_configs(cfg)
    assert pool_name in pools, f"KEDA scales on pool {pool_name!r}, herder has {sorted(pools)}"
    pool = pools[pool_name]
    assert pool.autoscale
    assert float(trigger["metadata"]["threshold"]) == pool.max_workers
    spec = manifests()["ScaledObject"]["spec"]
    assert spec["minReplicaCount"] >= 1, "at 0 pods nobody reports the metric"
    # The pods split the cluster's need (each takes its share) within KEDA's largest fleet.
    assert pool.cluster_max_workers == spec["maxReplicaCount"] * pool.max_workers


def test_the_wanted_gauge_is_one_herder_serves() -> None:
    _, metric, _ = keda_trigger()
    assert metric == WANTED_METRIC
    if f'"{WANTED_METRIC}"' not in METRICS_SOURCE.read_text():
        pytest.skip(f"{WANTED_METRIC} is not in supervisor/views/prometheus.py yet: checked by name only")


def test_resources_leave_room_for_every_pools_workers(tmp_path: Path) -> None:
    """herder bounds its default workers limit by the container's CPU quota and memory limit:
    min(16 x CPUs, memory / 64 MiB) must hold every pool's most workers."""
    cfg = resolve(write_config(tmp_path), pod_env())
    resources = container()["resources"]
    cpus = max(1, math.ceil(quantity(resources["limits"]["cpu"])))  # the quota rounded up, as herder does
    memory = quantity(resources["limits"]["memory"])
    limit = min(limits.WORKERS_PER_CPU * cpus, int(memory // limits.MEMORY_PER_WORKER))
    most = sum(p.ceiling for p in settings.pool_configs(cfg).values())
    assert limit >= most, f"the pod's workers limit {limit} is below the {most} workers its pools may run"
    assert quantity(resources["requests"]["memory"]) == memory


def test_pod_runs_as_the_images_user_on_a_read_only_root(tmp_path: Path) -> None:
    spec, c = pod_spec(), container()
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == image_uid() != 0
    assert spec["shareProcessNamespace"] is False, "herder's watchdog must be the pod's PID 1"
    assert spec["enableServiceLinks"] is False, "Service links inject HERDER_* variables"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    # The config file is the ConfigMap's, where --config looks.
    assert mounts[str(Path(config_path_in_pod()).parent)] == "config"
    # The state dir is below an emptyDir (herder creates it 0700 as itself: the emptyDir's own
    # root belongs to root), and /tmp is writable.
    state_dir = Path(resolve(write_config(tmp_path), pod_env()).state_dir)
    below = [p for p in mounts if Path(p) in state_dir.parents]
    assert below and "emptyDir" in volume(mounts[below[0]]), f"{state_dir} is not on an emptyDir"
    assert "emptyDir" in volume(mounts["/tmp"])


# ---- the image --------------------------------------------------------------------------


def test_dockerfile_runs_herder_run_as_pid_1_as_a_user() -> None:
    (base,) = instruction("FROM")
    assert base == "${BASE_IMAGE}"  # any base with python3 and venv, python:3.12-slim by default
    assert "BASE_IMAGE=python:3.12-slim" in instruction("ARG")
    (entrypoint,) = instruction("ENTRYPOINT")
    assert exec_form(entrypoint) == ["herder", "run"]  # exec form: no shell as PID 1
    assert image_uid() != 0
    assert instruction("STOPSIGNAL") == ["SIGTERM"]
    (install,) = [r for r in instruction("RUN") if "pip install" in r]
    assert "python3 -m venv /opt/herder" in install
    assert "/opt/herder/bin/pip install --no-cache-dir" in install and install.split()[-1] == "/src"
    assert image_env()["PATH"].startswith("/opt/herder/bin:")  # `herder` found, as in ENTRYPOINT
    (healthcheck,) = instruction("HEALTHCHECK")
    assert exec_form(healthcheck.split(" CMD ", 1)[1]) == ["herder", "status"]
    (cmd,) = instruction("CMD")
    assert exec_form(cmd) == ["--config", "/etc/herder/herder.toml"]


@pytest.mark.slow
def test_the_images_own_config_passes_herders_check() -> None:
    (copied,) = [r.split() for r in instruction("COPY") if r.endswith("/etc/herder/herder.toml")]
    r = subprocess.run(
        [HERDER, "config", "--config", str(REPO / copied[0])],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_environ({k: v for k, v in image_env().items() if k.startswith("HERDER_")}),
    )
    assert r.returncode == 0, r.stderr
    assert re.search(r"^http\s+0\.0\.0\.0:9100\s", r.stdout, re.M)


def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """Dockerfile.dockerignore as (exclude?, pattern), Docker's rules: `*` within a path
    element, `**` across them, a pattern also matching a file's parent directories, the last
    matching line winning."""
    rules = []
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        rx = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", pattern):
            rx += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        rules.append((not include, re.compile(rx)))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for exclude, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            excluded = exclude
    return not excluded


@pytest.mark.slow
def test_build_context_holds_what_pip_install_needs_and_nothing_else(tmp_path: Path) -> None:
    """The files Dockerfile.dockerignore lets into the context build herder's wheel, with its
    four packages and its data files; .venv, .git, build/, tests stay out."""
    rules = ignore_rules()
    kept_out = [".venv/bin/python", ".git/HEAD", "build/lib/x.py", "herder.egg-info/PKG-INFO"]
    kept_out += ["tests/conftest.py", "common/__pycache__/lines.cpython-311.pyc", "state/herder.sock"]
    for path in kept_out:
        assert not in_context(path, rules), f"{path} would be in the build context"
    for rest in instruction("COPY"):
        assert in_context(rest.split()[0], rules), f"COPY {rest}: not in the build context"
    context = tmp_path / "context"
    for root, dirs, files in os.walk(REPO):
        rel_root = Path(root).relative_to(REPO)
        dirs[:] = [d for d in dirs if d not in (".git", ".venv")]
        for name in files:
            rel = (rel_root / name).as_posix()
            if in_context(rel, rules):
                (context / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / rel, context / rel)
    wheels = Path(sys.prefix) / "peer-wheels"  # the cached build backend (scripts/setup, test extra)
    if not (wheels / ".stamp").is_file():
        pytest.skip(f"no wheel cache at {wheels} for an offline build (scripts/setup with the test extra)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-index", "--find-links", str(wheels),
         "-w", str(tmp_path / "dist"), str(context)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env | {"PIP_CONFIG_FILE": os.devnull},
    )  # fmt: skip
    assert r.returncode == 0, f"pip wheel of the build context failed:\n{r.stdout}\n{r.stderr}"
    (wheel,) = (tmp_path / "dist").glob("herder-*.whl")
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("herder/watchdog/core.py", "herder/supervisor/ctl/cli.py", "herder/worker/template.py",
                   "herder/common/config/schema.py"):  # fmt: skip
        assert module in names, f"{module} is not in the wheel built from the context"
    assert any(n.endswith("data/data/share/herder/herder.service.in") for n in names)
    # setuptools builds without its readme too, with an empty description: check it is there.
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    assert "herder keeps a fleet of" in zipfile.ZipFile(wheel).read(metadata).decode()


# ---- the entrypoint as PID 1 of a PID namespace, as in a pod ---------------------------------


def unshare_or_skip() -> str:
    exe = shutil.which("unshare")
    if exe is None:
        pytest.skip("no unshare (util-linux) here")
    probe = subprocess.run([exe, "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"a PID namespace is not permitted here (needs root): {probe.stderr.strip()}")
    return exe


def nspids(pid: int) -> list[int]:
    """The pid in each PID namespace it belongs to, outermost first (/proc/PID/status NSpid)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    raise AssertionError(f"no NSpid for {pid}")


def child_running(parent: int, argv_tail: list[str]) -> psutil.Process | None:
    try:
        for p in psutil.Process(parent).children():
            if p.cmdline()[-len(argv_tail) :] == argv_tail and p.status() != psutil.STATUS_ZOMBIE:
                return p
    except psutil.NoSuchProcess:
        pass
    return None


def reaped(p: psutil.Process) -> bool:
    """Gone from the process table: exited *and* waited for (a zombie is still there)."""
    try:
        p.status()
    except psutil.NoSuchProcess:
        return True
    return False


@pytest.mark.slow
def test_watchdog_is_pid_1_reaps_orphans_and_drains_on_sigterm(
    herder, redis_url: str, jobs, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    unshare = unshare_or_skip()
    nsenter = shutil.which("nsenter")
    config = write_config(tmp_path)
    env = pod_env(redis_url)  # the Redis URL as the Secret gives it: HERDER_REDIS_URL
    env.pop("HERDER_STATE_DIR")  # the test's own state dir, a flag below
    port = free_port()
    workdir = tmp_path / "pod"
    workdir.mkdir()
    h = Herder(
        redis_url, workdir, uuid.uuid4().hex, {"--redis-url": None, "--http": f"127.0.0.1:{port}"}, env
    )
    request.node.stash[HERDERS].append(h)  # the herder fixture kills what is left, whatever happens
    # The image's ENTRYPOINT and the Deployment's args, then the suite's short timeouts, the
    # state dir, the test jobs and a free port (flags win over the ConfigMap's file).
    (entrypoint,) = instruction("ENTRYPOINT")
    pod_args = [str(config) if a == config_path_in_pod() else a for a in container()["args"]]
    assert h.argv[:2] == [HERDER, "run"]
    h.argv = [unshare, "--pid", "--fork", "--mount-proc", "--kill-child", HERDER, *exec_form(entrypoint)[1:],
              *pod_args, *h.argv[2:]]  # fmt: skip
    h.start()

    # PID 1 is the process `herder run` started as: it exec'd the watchdog in its own place.
    pid1 = wait_for(lambda: psutil.Process(h.pid).children(), 10, what="unshare's child")[0].pid
    wait_for(
        lambda: psutil.Process(pid1).cmdline()[-2:] == ["-m", "herder.watchdog"],
        30,
        what="herder run to exec the watchdog",
    )
    assert nspids(pid1)[-1] == 1, f"the watchdog is not PID 1 of its namespace: NSpid {nspids(pid1)}"
    wait_for(lambda: http_status(f"http://127.0.0.1:{port}/healthz") == 200, 90, 0.25, what="/healthz 200")
    master = child_running(pid1, ["-m", "herder.supervisor"])
    assert master is not None and nspids(master.pid)[-1] != 1
    if f'"{WANTED_METRIC}"' in METRICS_SOURCE.read_text():
        _, metric, pool = keda_trigger()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert f'{metric}{{pool="{pool}"}}' in r.read().decode(), f"no {metric} for pool {pool}"

    # PID 1's other duty: an orphan in the namespace is re-parented to it, and it reaps it.
    if nsenter:
        subprocess.run(
            [nsenter, "--target", str(pid1), "--pid", "--", "sh", "-c", "sleep 2 & exit 0"],
            env=dict(os.environ, **{TAG_VAR: h.tag}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=True,
        )
        orphan = wait_for(lambda: child_running(pid1, ["sleep", "2"]), 2, 0.02, what="the orphan under PID 1")
        assert orphan.ppid() == pid1
        wait_for(lambda: reaped(orphan), 6, what=f"PID 1 to reap its adopted orphan {orphan.pid}")

    # A long job runs; the pod is deleted: SIGTERM to PID 1, as the kubelet sends it.
    job = jobs.enqueue("record", h.tag, 4)
    wait_for(lambda: jobs.started(h.tag) == [job.id], 30, what="the long job to start")
    signalled = time.monotonic()
    os.kill(pid1, signal.SIGTERM)
    code = h.wait_exit(60)
    took = time.monotonic() - signalled
    assert code == 0, f"herder exited {code} (through unshare); log ends:\n{h.log()[-3000:]}"
    assert jobs.status(job.id) == "finished"  # not interrupted: it finished in the drain
    assert jobs.started(h.tag) == [job.id] and jobs.finished(h.tag) == [job.id]
    assert took < 30, f"the drain took {took:.1f} s"
    assert "SIGTERM: stopping" in h.log()
    h.assert_nothing_left()
    assert not tagged(h.tag)
