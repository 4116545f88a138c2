"""Redis-facing helpers of the master: threads that read load and requeue jobs, and the
scripts and counters they run. The reconcile loop never waits on any of them."""
