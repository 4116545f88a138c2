"""Redis over TLS (`rediss://`) works wherever a Redis URL does: the master's threads, the
workers and the scheduler all connect through it, a killed worker's job is recovered
through it, and its password shows nowhere. A real TLS redis-server with a certificate
made for the test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from redis import Redis

from harness import free_port, run_jobs_killing_one_holder, wait_until_redis_answers

pytestmark = pytest.mark.slow

PASSWORD = "tls-s3cret-pw"


@pytest.fixture
def tls_redis(tmp_path: Path):  # noqa: ANN201
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not on PATH; scripts/setup installs it (apt-get install openssl)")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", "0", "--tls-port", str(port),
         "--bind", "127.0.0.1", "--tls-cert-file", str(cert), "--tls-key-file", str(key),
         "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no", "--requirepass", PASSWORD,
         "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    wait_until_redis_answers(Redis.from_url(url))
    yield url
    proc.terminate()
    proc.wait(10)


def test_herder_runs_and_recovers_jobs_over_tls_and_never_shows_the_password(herder, tls_redis: str) -> None:
    conn = Redis.from_url(tls_redis)
    h = herder(redis_url=tls_redis, workers="2")
    h.wait_workers(2)
    status = run_jobs_killing_one_holder(h, conn, "tls")
    assert status["redis_url"].startswith("rediss://") and PASSWORD not in str(status)
    h.stop_and_check()
    assert PASSWORD not in h.log()
