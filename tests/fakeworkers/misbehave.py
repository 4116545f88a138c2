"""A custom worker (--worker-command) that speaks the protocol badly on purpose.

usage: misbehave.py MODE   where MODE is one of
  flood        ready, then garbage, unknown verbs, a 10 MB line and 60k lines fast,
               while still heartbeating; then behaves
  close-stdout ready, then closes stdout but keeps running
  ignore-stop  ready and heartbeats, but never stops on `stop`
  stuck        ready, busy with a job, then beats on while saying its loop has made no
               progress outside the job for ever longer (a Redis call that never returns)
"""

from __future__ import annotations

import os
import sys
import time

mode = sys.argv[1]
out = os.dup(1)
os.dup2(2, 1)


def say(line: str) -> None:
    os.write(out, (line + "\n").encode())


say(f"ready {os.getpid()} {time.time()}")
if mode == "flood":
    say("garbage line")
    say("launch-missiles now")
    say("busy")  # wrong field count
    say("idle not-a-number")
    os.write(out, b"\xff\xfe\n")  # not UTF-8
    os.write(out, b"y" * 10_000_000 + b"\n")  # a 10 MB line
    chunk = ("bogus flood line\n" * 1000).encode()
    for _ in range(60):
        os.write(out, chunk)
        say(f"idle {time.time()}")
    sys.stderr.write("stderr flood\n" * 50000)
    sys.stderr.flush()
elif mode == "stuck":
    import select

    say(f"busy stuck-job {time.time()} 600")
    since = time.monotonic()
    while True:  # stuck, but a `stop` (or the master gone) ends it, so the test's stop is quick
        say(f"beat stuck-job {time.time()} {time.monotonic() - since + 0.1:.1f}")
        if select.select([0], [], [], 0.5)[0]:
            sys.exit(0)
elif mode == "close-stdout":
    os.close(out)
    while True:
        time.sleep(1)
# flood (after the flood) and ignore-stop: heartbeat forever, never read stdin
while True:
    say(f"idle {time.time()}")
    time.sleep(0.5)
