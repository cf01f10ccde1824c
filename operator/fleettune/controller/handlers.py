"""kopf wiring: one tuning daemon per TuningRun, woken by the events of its Jobs.

Only a daemon and raw event handlers are used: no change handlers, so kopf writes no
diff-base or progress annotations into users' objects (GitOps tools see no drift).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf

from fleettune import GROUP, PLURAL, VERSION, metrics
from fleettune.controller.kube import Kube
from fleettune.controller.tuner import RunLoop, is_settled
from fleettune.jobs import MANAGED_BY

IDLE_WAKEUP_S = 5.0
SETTLED_WAKEUP_S = 300.0

_wakers: dict[str, asyncio.Event] = {}
_kube: Kube | None = None


def kube() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # k8s Events only for what a user must see
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)


def _wake(uid: str | None) -> None:
    if uid and uid in _wakers:
        _wakers[uid].set()


@kopf.on.event("batch", "v1", "jobs", labels={MANAGED_BY: "fleettune"})
def job_event(body: kopf.Body, **_: Any) -> None:
    for owner in body.metadata.get("ownerReferences") or []:
        _wake(owner.get("uid"))


@kopf.on.event(GROUP, VERSION, PLURAL)
def run_event(uid: str, name: str, namespace: str, type: str | None, **_: Any) -> None:
    if type == "DELETED":
        metrics.forget_run(namespace, name)
    _wake(uid)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10.0)
async def tune(body: kopf.Body, uid: str, stopped: kopf.DaemonStopped, logger: logging.Logger, **_: Any) -> None:
    wake = _wakers.setdefault(uid, asyncio.Event())
    loop = RunLoop(kube(), body, logger)
    try:
        while not stopped:
            wake.clear()
            if is_settled(body):
                # Runs finished before this operator started still get their gauges.
                budget = (body.get("spec") or {}).get("budget") or {}
                metrics.observe_status(
                    body.metadata.namespace, body.metadata.name, dict(body.get("status") or {}),
                    parallelism=budget.get("parallelism"),
                )
                timeout = SETTLED_WAKEUP_S
            else:
                try:
                    finished = await loop.step()
                except kopf.TemporaryError:
                    raise
                except Exception as exc:  # keep tuning after API hiccups; report and retry
                    logger.exception("tuning step failed: %s", exc)
                    metrics.reconcile_error(body.metadata.namespace, body.metadata.name)
                    finished = False
                timeout = SETTLED_WAKEUP_S if finished else IDLE_WAKEUP_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=timeout)
    finally:
        _wakers.pop(uid, None)
