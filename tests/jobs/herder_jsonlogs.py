"""A noisy job for tests/test_json_logs.py: what an app writes to stderr, in every shape the
JSON log must survive. Each line carries the tag, so the test finds its own."""

from __future__ import annotations

import json
import sys
import time

from rq import get_current_job

BIG = 100_000  # bytes: far past the line limit (herder.common.lines.MAX_LINE_BYTES)


def noisy(tag: str) -> str:
    job = get_current_job()
    assert job is not None
    out = sys.stderr
    out.write(f"plain text {tag}\n")
    app = {"msg": f"app says {tag}", "level": "warning", "ts": 12345, "pid": 1, "order": 7, "tag": tag}
    out.write(json.dumps(app) + "\n")
    out.write(json.dumps({"event": f"no msg {tag}", "nested": {"a": [1, 2]}}) + "\n")
    out.write(f'{{"broken": "{tag}", \n')  # starts like an object, is not one
    out.write(f'["array", "{tag}"]\n')  # valid JSON, not an object
    out.write(f'{{"nan": NaN, "tag": "{tag}"}}\n')  # Python reads it; strict JSON readers do not
    out.write(f"huge {tag} " + "x" * BIG + "\n")
    out.write(json.dumps({"tag": tag, "pad": "y" * BIG}) + "\n")  # valid JSON, but enormous
    out.flush()
    time.sleep(0.5)  # still running while the master relays these: they carry the job's id
    job.connection.rpush(f"finished:{tag}", job.id)
    return tag
