"""Tables in the format serving stacks load (pure): vLLM's and SGLang's tuned-config files.

vLLM and SGLang read one JSON file per kernel shape and GPU from a folder
(``VLLM_TUNED_CONFIG_FOLDER``), named after the shape and the GPU as the driver names it with
spaces as underscores (``E=8,N=14336,device_name=NVIDIA_A100-SXM4-80GB.json``), whose keys are
batch sizes M and values the best configuration at that M; at run time they take the
nearest tuned M. With ``spec.publish.format: vllm`` the published ConfigMap holds one such
table per file name, built from the measured entries: the name from
``spec.publish.vllm.fileName`` and the entry's device, the key from the problem size's
``batchDimension``. Two pools on the same GPU write the same file; the faster entry at each M
wins. A ConfigMap key cannot hold ``=`` or ``,``, so each table is stored under a key of safe
characters, and :data:`ITEMS_KEY` lists ``{"key", "path"}`` pairs: the ``items`` of a
ConfigMap volume that puts every table at its file name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Protocol

from fleettune.api import VllmTableSpec
from fleettune.names import short_hash
from fleettune.sizes import ProblemSize

ITEMS_KEY = "vllm-items.json"
KEY_PREFIX = "vllm."
_PLACEHOLDER = re.compile(r"\{device\}|\{problem_size\[([0-2])\]\}")
_UNSAFE = re.compile(r"[^-._a-zA-Z0-9]+")


class Measured(Protocol):
    """What a table needs of a published entry."""

    @property
    def problem_size(self) -> ProblemSize: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def time_ms(self) -> float: ...
    @property
    def device_name(self) -> str: ...


def device_name(product: str) -> str:
    """The GPU's name as vLLM and SGLang spell it in file names (torch's, spaces as underscores)."""
    return "_".join(product.split())


def file_name(template: str, device: str, problem_size: ProblemSize) -> str:
    """The template with its placeholders filled; ValueError for a dimension the size lacks."""
    def fill(match: re.Match[str]) -> str:
        if match.group(1) is None:
            return device_name(device)
        i = int(match.group(1))
        if i >= len(problem_size):
            raise ValueError(f"{{problem_size[{i}]}}: the problem size {list(problem_size)} has no dimension {i}")
        return str(problem_size[i])

    return _PLACEHOLDER.sub(fill, template)


def tables(entries: Iterable[Measured], spec: VllmTableSpec) -> dict[str, dict[str, Any]]:
    """File name -> table (M as a string -> configuration), M in ascending order. Entries with
    no reported device, or whose size lacks the batch dimension, have no table."""
    best: dict[str, dict[int, tuple[float, dict[str, Any]]]] = {}
    for e in entries:
        if not e.device_name or spec.batch_dimension >= len(e.problem_size):
            continue
        name = file_name(spec.file_name, e.device_name, e.problem_size)
        m = int(e.problem_size[spec.batch_dimension])
        held = best.setdefault(name, {}).get(m)
        if held is None or e.time_ms < held[0]:
            best[name][m] = (e.time_ms, e.config)
    return {name: {str(m): rows[m][1] for m in sorted(rows)} for name, rows in sorted(best.items())}


def config_map_data(entries: Iterable[Measured], spec: VllmTableSpec) -> dict[str, str]:
    """The tables as ConfigMap data: one key per table and the volume items (:data:`ITEMS_KEY`)."""
    data: dict[str, str] = {}
    items = []
    for name, table in tables(entries, spec).items():
        key = KEY_PREFIX + _UNSAFE.sub("_", name)
        if key in data:  # two names that differ only in characters a key cannot hold
            key = f"{key.removesuffix('.json')}.{short_hash(name, 8)}.json"
        data[key] = json.dumps(table, indent=4) + "\n"
        items.append({"key": key, "path": name})
    if items:
        data[ITEMS_KEY] = json.dumps(items, indent=1) + "\n"
    return data

