"""herder's fast job lifecycle: RQ's own writes for each job in one round trip (see worker.py)."""
