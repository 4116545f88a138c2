"""A custom worker (--worker-command) that says `ready` only once a gate file exists, then
idles (heartbeating) until `stop` or EOF on stdin: a fleet whose start the test controls.

usage: gated.py GATE_FILE
"""

from __future__ import annotations

import os
import select
import sys
import time

gate = sys.argv[1]
out = os.dup(1)
os.dup2(2, 1)


def say(line: str) -> None:
    os.write(out, (line + "\n").encode())


while not os.path.exists(gate):
    time.sleep(0.05)
say(f"ready {os.getpid()} {time.time()}")
while True:
    readable, _, _ = select.select([sys.stdin], [], [], 0.5)
    if readable:
        line = sys.stdin.readline()
        if not line or line.strip() == "stop":
            say(f"stop {time.time()}")
            sys.exit(0)
    say(f"idle {time.time()}")
