"""The user's code that runs as a worker-side process starts: Django's setup and the
`--worker-init` hook. Never in the master or the watchdog (they never import job code).

Django (gunicorn's post_fork, celery's worker_process_init): `django.setup()` runs once, in the
warm template before any worker is forked, so every worker starts with the apps loaded; each
forked worker then closes the database connections it inherited (a socket shared by two
processes corrupts both). A plain-spawned worker (no fork server) runs `django.setup()` itself.

`--worker-init module:function` runs in every worker, forked or not, after Django and before
the worker says `ready`: if it raises, the worker exits 1 with the traceback in the log, it
never takes a job, and the master backs its slot off like any worker that dies before `ready`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from herder.common.config import Config


def setup_django(cfg: Config) -> None:
    """django.setup() with the configured settings module (in the template, or a plain worker)."""
    if not cfg.django_settings:
        return
    os.environ["DJANGO_SETTINGS_MODULE"] = cfg.django_settings
    import django

    django.setup()


def django_after_fork(cfg: Config) -> None:
    """In a worker: close the connections a forked worker inherited, or set Django up if this
    worker is a new interpreter."""
    if not cfg.django_settings:
        return
    apps = sys.modules.get("django.apps")
    if apps is not None and apps.apps.ready:  # forked from a template that set Django up
        from django.db import connections

        connections.close_all()
        return
    setup_django(cfg)


def resolve_hook(spec: str) -> Callable[[], object]:
    """`module:function` (or `module.function`) as a callable."""
    module, _, name = spec.partition(":") if ":" in spec else spec.rpartition(".")
    import importlib

    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return target  # type: ignore[return-value]


def run_worker_init(cfg: Config) -> None:
    if cfg.worker_init:
        resolve_hook(cfg.worker_init)()
