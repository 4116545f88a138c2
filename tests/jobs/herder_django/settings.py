"""Django settings of the test project. Each process that imports this module appends its pid
to $HERDER_TEST_DJANGO_MARK, so a test can tell where django.setup() ran (the warm template,
not each forked worker)."""

import os

if os.environ.get("HERDER_TEST_DJANGO_MARK"):
    with open(os.environ["HERDER_TEST_DJANGO_MARK"], "a") as f:
        f.write(f"{os.getpid()}\n")

SECRET_KEY = "herder-tests-only"
USE_TZ = True
INSTALLED_APPS = ["herder_django"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
_url = os.environ.get("HERDER_TEST_REDIS_URL", "redis://127.0.0.1:1/0")
RQ_QUEUES = {"django-default": {"URL": _url}, "django-low": {"URL": _url}}
