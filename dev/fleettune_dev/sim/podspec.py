"""What the simulator reads from a trial Pod's JSON: the trial container, its batch and environment.

Pods are handled as raw JSON (``dict``), as the watch delivers them. The trial container is
the one named ``trial`` (:data:`~fleettune_job.protocol.CONTAINER_NAME`), or else any
container carrying ``FLEETTUNE_TRIAL``; a Pod without one has no trial (None).
"""

from __future__ import annotations

from typing import Any

from fleettune_job.protocol import CONTAINER_NAME, TRIAL_ENV, Batch


def trial_container(pod: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The container carrying the trial, and the trial's text."""
    containers = list((pod.get("spec") or {}).get("containers") or [])
    # The job's container is named `trial`; fall back to any container carrying the env.
    containers.sort(key=lambda c: c.get("name") != CONTAINER_NAME)
    for c in containers:
        for env in c.get("env") or []:
            if env.get("name") == TRIAL_ENV:
                return c, env.get("value") or ""
    return None


def trial_env_vars(pod: dict[str, Any]) -> dict[str, str]:
    """The trial container's environment (literal values)."""
    found = trial_container(pod)
    return {e["name"]: e.get("value") or "" for e in (found[0].get("env") or [] if found else [])}


def trial_env(pod: dict[str, Any]) -> str | None:
    found = trial_container(pod)
    return found[1] if found else None


def started_at(pod: dict[str, Any]) -> dict[str, str]:
    out = {}
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        begun = ((status.get("state") or {}).get("running") or {}).get("startedAt")
        if begun:
            out[status["name"]] = begun
    return out


def trial_id(pod: dict[str, Any]) -> tuple[str, str, str, int]:
    ns = pod["metadata"].get("namespace", "")
    try:
        work = Batch.from_env(trial_env(pod) or "")
    except ValueError:
        return (ns, "", "", -1)
    return (ns, work.run, work.target, -1)
