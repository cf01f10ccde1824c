"""A list-then-watch of raw JSON objects (dicts): the client's models are slow to build, and
a fleet's Pods change several times each."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.watch.watch import iter_resp_lines


class WatchExpired(Exception):
    """The resource version is too old (410 Gone): list again."""


def raw_list(func: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
    """The items and the list's resource version."""
    resp = func(*args, _preload_content=False, **kwargs)
    doc = json.loads(resp.data)
    return doc["items"], doc["metadata"]["resourceVersion"]


def raw_watch(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(event type, object) until the server ends the watch; bookmarks are passed on (they
    carry the resource version to resume from)."""
    resp = func(*args, watch=True, _preload_content=False, **kwargs)
    try:
        for line in iter_resp_lines(resp):
            if not line or line.isspace():
                continue
            event = json.loads(line)
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                if status.get("code") == 410:
                    raise WatchExpired(status.get("message", "resource version too old"))
                raise RuntimeError(f"watch error: {status}")
            yield event["type"], event["object"]
    finally:
        resp.close()
        resp.release_conn()
