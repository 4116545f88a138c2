"""A minimal Django project for tests/test_worker_hooks.py: an in-memory SQLite database,
one app with one model, and django-rq's RQ_QUEUES naming the test's Redis."""
