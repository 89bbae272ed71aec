"""A Django app publishes tasks from its views with `ms.SyncScheduler`; workers run them.

Django views are synchronous, so they publish, read and cancel through `SyncScheduler`
(pymongo's synchronous client underneath); the workers are the usual async consumers, in
a process of their own (`mscheduler worker examples.django_app:handlers`). One file holds the
settings, the views and the URLs, so it runs as is (with Django installed), driving the app
with Django's test client and running a worker in between:

    python examples/django_app.py [--uri mongodb://localhost:27017/app]

In a project: ``MSCHEDULER_URI`` in settings.py, `scheduler()` in a module of the app, and
the handlers in another module for ``mscheduler worker``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import types
import uuid
from typing import Any

import anyio
import django
from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.test import Client, override_settings
from django.urls import path
from django.views.decorators.http import require_http_methods

import mscheduler as ms
from mscheduler.errors import TaskNotFound

COLLECTION = "django_example"


@functools.cache
def scheduler(uri: str) -> ms.SyncScheduler:
    """One per process and URI, opened at the first request (not at import: a server that
    forks its workers after importing the app must not share a client across the fork).
    Thread-safe on a MongoDB URI, so every request thread shares it."""
    return ms.SyncScheduler.connect(uri, collection=COLLECTION)


# ---------------------------------------------------------------- views


@require_http_methods(["GET", "POST"])
def report(request: HttpRequest, name: str) -> JsonResponse:
    sched = scheduler(settings.MSCHEDULER_URI)
    key = f"report:{name}"
    if request.method == "POST":
        # Idempotent by key: a double-submitted form makes one task, not two.
        result = sched.publish(
            key,
            {"report": name, "format": request.POST.get("format", "pdf")},
            name="report",
            options=ms.TaskOptions(max_unexpected_retries=2),
        )
        return JsonResponse({"key": key, "created": result.created}, status=202)
    task = sched.get(key)
    if task is None:
        return JsonResponse({"error": f"no report {name!r}"}, status=404)
    return JsonResponse({"state": task.state.value, "result": task.result})


@require_http_methods(["POST"])
def cancel_report(request: HttpRequest, name: str) -> JsonResponse:
    try:
        cancelled = scheduler(settings.MSCHEDULER_URI).cancel(
            f"report:{name}", "cancelled by a user"
        )
    except TaskNotFound:
        return JsonResponse({"error": f"no report {name!r}"}, status=404)
    return JsonResponse({"cancelled": cancelled})


urls = types.ModuleType("urls")  # what a project's urls.py is
urls.urlpatterns = [  # type: ignore[attr-defined]
    path("reports/<slug:name>/", report),
    path("reports/<slug:name>/cancel/", cancel_report),
]


# ---------------------------------------------------------------- the worker's handlers


async def build_report(task: ms.Task) -> dict[str, Any]:
    return {"rows": 42, "file": f"{task.payload['report']}.{task.payload['format']}"}


handlers = {"report": build_report}


async def run_worker(uri: str, keys: list[str]) -> None:
    """What ``mscheduler worker examples.django_app:handlers`` does, until ``keys`` ended."""
    async with await ms.Scheduler.connect(uri, collection=COLLECTION) as sched:
        options = ms.WorkerOptions(worker_id="django-worker", poll_interval_ms=20)
        async with sched.consumers(handlers, options=options):
            await sched.wait_many(keys, timeout=30, poll_interval_ms=20)


# ---------------------------------------------------------------- the run


def configure() -> None:
    if not settings.configured:
        settings.configure(
            DEBUG=False,
            SECRET_KEY="an example, not a secret",
            ALLOWED_HOSTS=["testserver"],
            INSTALLED_APPS=[],
            MIDDLEWARE=[],
            DATABASES={},
            ROOT_URLCONF=urls,
            LOGGING_CONFIG=None,  # the application configures logging (see __main__)
        )
        django.setup()


def main(uri: str = "memory://") -> dict[str, Any]:
    if uri == "memory://":
        # The views and the worker must share the embedded database: give it a name.
        uri = f"memory://django-{uuid.uuid4().hex[:8]}"
    configure()
    client = Client()
    try:
        with override_settings(ROOT_URLCONF=urls, MSCHEDULER_URI=uri):
            first = client.post("/reports/sales/", {"format": "csv"})
            again = client.post("/reports/sales/", {"format": "csv"})  # double submit
            client.post("/reports/stale/")
            cancelled = client.post("/reports/stale/cancel/").json()
            before = client.get("/reports/sales/").json()
            anyio.run(run_worker, uri, ["report:sales", "report:stale"])
            after = client.get("/reports/sales/").json()
            missing = client.get("/reports/nothing/")
    finally:
        scheduler(uri).close()
        scheduler.cache_clear()

    assert first.status_code == 202 and first.json()["created"] is True
    assert again.json()["created"] is False, "a double submit made two tasks"
    assert cancelled == {"cancelled": True}
    assert before["state"] == "pending"
    assert after == {"state": "success", "result": {"rows": 42, "file": "sales.csv"}}
    assert missing.status_code == 404
    summary = {"published": 2, "report": after["result"]["file"], "cancelled": 1}
    print(f"django app: {summary}")
    return summary


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", default="memory://")
    logging.basicConfig(level=logging.ERROR)
    main(parser.parse_args().uri)
