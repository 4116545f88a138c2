"""RQ cron config for tests/test_cron.py: herder_testjobs.record("cron") every second."""

from herder_testjobs import record
from rq import cron

cron.register(record, "default", args=("cron",), interval=1)
