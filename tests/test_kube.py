"""deploy/kubernetes's Deployment run by an engine that reads it: `podman kube play` of the real
deployment.yaml and configmap.yaml, with the Redis URL in a podman secret, against the test's
redis-server on the host, as docs/deploy/containers.md ("Trying the manifests with podman")
tells an operator to.

What an operator changes, and nothing else: the Deployment's `image:` names an image FROM
herder's with the job code in /srv/app (here the test jobs), and the secret holds the URL of
this Redis (the host's loopback as slirp4netns shows it to the pod, 10.0.2.2, with
`kube play --network slirp4netns:allow_host_loopback=true`). The ConfigMap is played from its
own file (`--configmap`), unmodified.

Asserted as podman 4.3 (Debian 12's) really does it, each point where a later podman differs
said where it is checked: the pod runs herder's watchdog as its PID 1 under the pod's user and
limits; the livenessProbe becomes podman's health check (the other probes are ignored);
terminationGracePeriodSeconds is ignored and `podman kube down` stops with no grace at all, so
the drain is `podman stop -t <grace>` of the container, then `podman kube down`: the running
job finishes, none is requeued or lost, the pod is gone.

The Secret, the ConfigMap's volume and the emptyDir volumes are podman objects with the
manifest's names (herder-redis, herder-config, state, tmp) and the pod is herder-pod-0, so the
test refuses to start where one exists already rather than replace someone else's.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml
from redis import Redis
from rq import Queue
from rq.registry import StartedJobRegistry

from harness import JobsHelper, http_status, image_uid, reap_adopted, wait_for
from podman import CAP, REPO, Podman

pytestmark = [pytest.mark.slow, pytest.mark.container]

KUBERNETES = REPO / "deploy" / "kubernetes"
DEPLOYMENT = KUBERNETES / "deployment.yaml"
CONFIGMAP = KUBERNETES / "configmap.yaml"
JOBS = REPO / "tests" / "jobs" / "herder_testjobs.py"
# slirp4netns' address for the host's loopback (allow_host_loopback), where the test's
# redis-server listens.
HOST_LOOPBACK = "10.0.2.2"
NETWORK = "slirp4netns:allow_host_loopback=true"


def version(podman: Podman) -> tuple[int, int]:
    text = podman.run("version", "--format", "{{.Client.Version}}").stdout.strip()
    major, minor = re.match(r"(\d+)\.(\d+)", text).groups()  # type: ignore[union-attr]
    return int(major), int(minor)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


@dataclass
class Played:
    """The Deployment as podman played it, and what the manifest says of it."""

    podman: Podman
    version: tuple[int, int]
    deployment: Path  # the played copy: deployment.yaml with the operator's image
    spec: dict[str, Any]  # the pod template's spec
    pod: str
    container: str

    @property
    def herder(self) -> dict[str, Any]:
        (c,) = self.spec["containers"]
        return c

    def exec(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.podman.run("exec", self.container, *argv, check=check, timeout=60)

    def status(self) -> dict[str, Any] | None:
        r = self.exec("herder", "status", "--json", check=False)
        return json.loads(r.stdout) if r.stdout.strip() else None

    def inspect(self) -> dict[str, Any]:
        return json.loads(self.podman.run("inspect", self.container).stdout)[0]

    def logs(self) -> str:
        r = self.podman.run("logs", self.container, check=False)
        return (r.stdout + r.stderr)[-4000:]


def with_image(text: str, image: str) -> str:
    """deployment.yaml with its `image:` naming `image`, every other byte as shipped."""
    (c,) = yaml.safe_load(text)["spec"]["template"]["spec"]["containers"]
    line = f"image: {c['image']}"
    assert text.count(line) == 1, f"deployment.yaml should say `{line}` once"
    return text.replace(line, f"image: {image}")


def build_app_image(podman: Podman, herder: str, tag: str, tmp_path: Path) -> None:
    """The operator's image: FROM herder's, the job code in /srv/app (the Dockerfile's header)."""
    context = tmp_path / "app"
    context.mkdir()
    (context / JOBS.name).write_bytes(JOBS.read_bytes())
    (context / "Containerfile").write_text(f"FROM {herder}\nCOPY {JOBS.name} /srv/app/\n")
    podman.run("build", *podman.ulimits(), "--network", "none", "--format", "docker", "-t", tag, str(context),
               timeout=300)  # fmt: skip


def create_secret(podman: Podman, spec: dict[str, Any], redis_url: str) -> str:
    """The Secret the Deployment's env names, holding `redis_url`, as podman 4.3 reads one: a
    podman secret whose data is a JSON object of base64 values. (4.3 also stores a `kind:
    Secret` played with the Deployment, but as YAML, which its secretKeyRef cannot read: "secret
    herder-redis is not valid JSON"; 4.4 reads both.) From stdin: the URL touches no file."""
    (c,) = spec["containers"]
    (ref,) = [e["valueFrom"]["secretKeyRef"] for e in c["env"] if e["name"] == "HERDER_REDIS_URL"]
    data = {ref["key"]: base64.b64encode(redis_url.encode()).decode()}
    podman.run("secret", "create", ref["name"], "-", input=json.dumps(data))
    return ref["name"]


@pytest.fixture
def played(
    image: tuple[Podman, str], redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Played]:
    podman, herder = image
    # podman's default limits exceed this host's hard ones and a container then fails on
    # setrlimit; `kube play` has no --ulimit, so they come from a containers.conf of the test's
    # own (CONTAINERS_CONF replaces the host's files: nothing else in them matters to this pod).
    conf = tmp_path / "containers.conf"
    conf.write_text(f'[containers]\ndefault_ulimits = ["nofile={CAP}:{CAP}", "nproc={CAP}:{CAP}"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))

    text = DEPLOYMENT.read_text()
    manifest = yaml.safe_load(text)
    spec = manifest["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    # podman names a Deployment's pods <name>-pod-<i> (one: there is no `replicas`), and each
    # container <pod>-<container>.
    pod = f"{manifest['metadata']['name']}-pod-0"
    volumes = {v.get("configMap", {}).get("name", v["name"]) for v in spec["volumes"]}
    secret = next(e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e)
    v = version(podman)
    secrets = podman.run("secret", "ls", "--format", "{{.Name}}").stdout.split()
    taken = [f"pod {pod}"] if podman.run("pod", "exists", pod, check=False).returncode == 0 else []
    taken += [f"secret {secret}"] if secret in secrets else []
    taken += [
        f"volume {n}"
        for n in sorted(volumes)
        if podman.run("volume", "exists", n, check=False).returncode == 0
    ]
    # podman before 4.8 publishes a containerPort with no hostPort on the host, at that number.
    ports = [p["containerPort"] for p in c["ports"]]
    if v < (4, 8):
        taken += [f"host port {p}" for p in ports if listening(p)]
    assert not taken, f"already here: {', '.join(taken)} (another run's? `podman kube down` it)"

    app = herder.replace("/herder-test:", "/herder-test-app:")
    played_file = tmp_path / DEPLOYMENT.name
    played_file.write_text(with_image(text, app))
    url = urlsplit(redis_url)
    try:
        build_app_image(podman, herder, app, tmp_path)
        create_secret(podman, spec, urlunsplit(url._replace(netloc=f"{HOST_LOOPBACK}:{url.port}")))
        podman.run("kube", "play", "--network", NETWORK, "--configmap", str(CONFIGMAP), str(played_file),
                   timeout=300)  # fmt: skip
        yield Played(podman, v, played_file, spec, pod, f"{pod}-{c['name']}")
    finally:
        podman.run("kube", "down", str(played_file), check=False, timeout=300)
        podman.run("pod", "rm", "-f", "-t", "0", pod, check=False, timeout=120)  # after a failed play
        podman.run("secret", "rm", secret, check=False)
        for name in sorted(volumes):  # the ConfigMap's volume outlives `kube down`
            podman.run("volume", "rm", name, check=False)
        podman.run("rmi", "-f", app, check=False, timeout=120)
        reap_adopted()  # podman's conmon, re-parented to this subreaper


def test_podman_plays_the_deployment_runs_jobs_and_drains_on_stop(played: Played, conn: Redis) -> None:
    p, c = played, played.herder
    jobs = JobsHelper(conn)
    started = time.monotonic()

    # 1. The pod runs herder: every worker up, the watchdog PID 1 of the pod's own PID
    # namespace (shareProcessNamespace: false), every process as the image's user.
    def running() -> dict[str, Any] | None:
        st = p.status()
        return st if st and st.get("running") and st["actual"] == st["desired"] else None

    try:
        st = wait_for(running, 90, 0.5, what="herder running in the pod, all workers up")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log ends:\n{p.logs()}") from None
    print(f"herder running {time.monotonic() - started:.1f} s after `podman kube play` returned")
    assert st["workers_limit"] == 16, st  # min(16 x 2 CPUs, 1 GiB / 64 MiB): the pod's limits
    pid1 = p.exec("cat", "/proc/1/cmdline").stdout.split("\0")
    assert pid1[-3:-1] == ["-m", "herder.watchdog"], pid1
    procs = [line.split(None, 1) for line in p.exec("ps", "-e", "-o", "uid=,args=").stdout.splitlines()]
    assert {int(uid) for uid, _ in procs} == {image_uid()}, procs
    assert len(procs) >= 2 + st["actual"]  # the watchdog, the master, the workers (and ps)

    # /healthz answers inside the pod, where the kubelet's probes would ask.
    port = c["ports"][0]["containerPort"]
    healthz = f"http://127.0.0.1:{port}/healthz"
    probe = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).status)"
    wait_for(lambda: p.exec("python3", "-c", probe, healthz, check=False).stdout.strip() == "200", 30, 0.25,
             what=f"{healthz} 200 inside the pod")  # fmt: skip
    if p.version < (4, 8):  # and on the host: podman before 4.8 publishes the containerPort there
        assert http_status(healthz) == 200

    # What podman made of the rest of the spec.
    info = p.inspect()
    cfg, host = info["Config"], info["HostConfig"]
    pod_security = p.spec["securityContext"]
    assert cfg["User"] == f"{pod_security['runAsUser']}:{pod_security['runAsGroup']}"
    assert host["ReadonlyRootfs"] is True  # readOnlyRootFilesystem
    assert "no-new-privileges" in host["SecurityOpt"]  # allowPrivilegeEscalation: false
    assert not host["CapAdd"] and "CAP_CHOWN" in host["CapDrop"]  # capabilities: drop ALL
    assert host["Memory"] == 2**30 and host["NanoCpus"] == 2 * 10**9  # resources.limits
    assert host["MemoryReservation"] == 2**30  # the memory request (the CPU request: ignored)
    assert host["RestartPolicy"]["Name"] == "always"  # a pod's default restartPolicy
    mounts = {m["Destination"]: m for m in info["Mounts"]}
    assert {"/etc/herder", "/var/lib/herder", "/tmp"} <= set(mounts) and not mounts["/etc/herder"]["RW"]
    # The livenessProbe becomes podman's health check: its command run in the container, its
    # period, timeout and failure threshold, and a restart when it fails that many times. (It
    # runs on systemd timers, so only where podman can reach systemd; `podman healthcheck run`
    # runs it once.) The startup and readiness probes are not read before podman 4.4.
    live = c["livenessProbe"]
    check = cfg["Healthcheck"]
    # herder's port, by number: podman before 4.7 turns a port's name into 0.
    assert " ".join(check["Test"]) == f"CMD-SHELL curl -f http://localhost:{port}/healthz || exit 1", check
    assert (
        check["Interval"] == live["periodSeconds"] * 10**9
        and check["Timeout"] == live["timeoutSeconds"] * 10**9
    )
    assert check["Retries"] == live["failureThreshold"]
    assert cfg["HealthcheckOnFailureAction"] == "restart"
    if p.version < (4, 4):
        assert "StartupHealthCheck" not in cfg
    # The image has no curl, so that check fails: an image of your own adds curl for it.
    hc = p.podman.run("healthcheck", "run", p.container, check=False)
    assert (hc.returncode, hc.stdout.strip()) == (1, "unhealthy"), hc
    assert "curl: not found" in json.dumps(p.inspect()["State"]["Health"]["Log"])
    # terminationGracePeriodSeconds is read from podman 4.7 on; before, podman's default 10 s.
    grace = p.spec["terminationGracePeriodSeconds"]
    assert cfg["StopTimeout"] == (grace if p.version >= (4, 7) else 10)

    # 2. A job enqueued into that Redis runs.
    tag = uuid.uuid4().hex
    quick = jobs.enqueue("record", tag)
    jobs.wait_finished(quick.id, 30, what="a job enqueued from the host to run in the pod")

    # 3. The drain: a job of a few seconds is running when the pod is stopped. `podman kube
    # down` stops with no grace before podman 5.1 (SIGKILL at once), and `podman pod stop -t`
    # before 5.5 stops the pod's infra container alongside, which takes the pod's network away
    # mid-drain; so the container first, with the grace period, then `kube down`.
    tag = uuid.uuid4().hex
    long = jobs.enqueue("record", tag, 4)
    wait_for(lambda: jobs.started(tag) == [long.id], 30, what="the long job to start")
    stopping = time.monotonic()
    p.podman.run("stop", "-t", str(grace), p.container, timeout=grace + 30)
    took = time.monotonic() - stopping
    assert p.inspect()["State"]["ExitCode"] == 0, p.logs()
    assert took < 30, f"the stop took {took:.1f} s: SIGKILLed at the end of the grace period?"
    assert jobs.status(long.id) == "finished"
    assert jobs.started(tag) == [long.id] and jobs.finished(tag) == [long.id]  # run once, to its end
    for queue in ("default", "bulk", "high"):  # nothing requeued, nothing left held
        assert Queue(queue, connection=conn).count == 0, queue
        assert StartedJobRegistry(queue, connection=conn).get_job_ids() == [], queue
    p.podman.run("kube", "down", str(p.deployment), timeout=120)
    assert p.podman.run("pod", "exists", p.pod, check=False).returncode == 1, "the pod is still there"
    print(f"the whole play took {time.monotonic() - started:.1f} s")
