"""Raw requests through the Kubernetes client: manifests in, JSON out.

The operator sends plain manifest dicts and reads answers with ``_preload_content=False``,
skipping the client's model classes (slow to build, slower to parse). The client's type
hints name those models; these two helpers say, in one place, what really goes through.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, cast


class _RawResponse(Protocol):
    """What a client call with ``_preload_content=False`` returns: the HTTP response."""

    data: bytes


def raw_json(resp: object) -> dict[str, Any]:
    """The JSON body of a call made with ``_preload_content=False``."""
    return cast(dict[str, Any], json.loads(cast(_RawResponse, resp).data))


def manifest(body: Mapping[str, Any]) -> Any:
    """A manifest dict where the client's signature names a model: the client serializes
    the dict as it is."""
    return body
