"""Enqueue a burst of example jobs: python examples/enqueue.py [--count N] [--redis-url URL]"""

from __future__ import annotations

import argparse
import os
import random

from redis import Redis
from rq import Queue


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=40)
    p.add_argument("--queue", default="default")
    p.add_argument("--redis-url", default=os.environ.get("HERDER_REDIS_URL", "redis://127.0.0.1:6379/0"))
    args = p.parse_args()
    q = Queue(args.queue, connection=Redis.from_url(args.redis_url))
    for i in range(args.count):
        if i % 5 == 4:
            q.enqueue("jobs.flaky", f"item-{i}")
        else:
            q.enqueue("jobs.resize_image", f"photo-{i}.jpg", round(random.uniform(0.2, 1.5), 2))
    print(f"enqueued {args.count} example jobs on {args.queue!r}")


if __name__ == "__main__":
    main()
