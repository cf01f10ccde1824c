"""Recorded measurements and the file helpers shared by the interop formats.

Recorded failures map onto three kinds: "compile" (build failed, e.g. resource limits),
"runtime" (launch/run failed, wrong result, timeout) and "invalid" (rejected before compiling).
"""

from __future__ import annotations

import gzip
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fleettune.space.errors import SpaceError
from fleettune.space.space import SearchSpace

FAILURES = ("compile", "runtime", "invalid")
KT_FAILURE_IN = {"CompilationFailedConfig": "compile", "RuntimeFailedConfig": "runtime", "InvalidConfig": "invalid"}
KT_FAILURE_OUT = {v: k for k, v in KT_FAILURE_IN.items()}
# Old Kernel Tuner versions stored failed configurations as this huge "time".
KT_FAILED_TIME = 1e19
KT_BOOKKEEPING = ("time", "times")


@dataclass
class Record:
    """One measured configuration: ``time_ms`` when it ran, else ``failure`` in `FAILURES`."""

    config: dict[str, Any]
    time_ms: float | None
    failure: str | None = None
    times: list[float] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # other source fields, kept for writing back


@dataclass
class RecordedSpace:
    """A recorded space: the unrestricted space of the recorded parameters plus what was measured."""

    space: SearchSpace
    records: list[Record]
    device_name: str | None = None
    kernel_name: str | None = None
    problem_size: Any = None
    rows: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int32))
    objective: str = "time"
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def valid_records(self) -> list[Record]:
        return [r for r in self.records if r.failure is None and r.time_ms is not None]

    def best(self) -> Record | None:
        timed = [(r.time_ms, r) for r in self.valid_records if r.time_ms is not None]
        return min(timed, key=lambda tr: tr[0])[1] if timed else None


# ---------------------------------------------------------------------------------------------
# reading helpers


def read_text(path: str | os.PathLike[str]) -> str:
    where = os.fspath(path)
    try:
        with open(where, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise SpaceError(where, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError):
            # A gzip stream cut short (interrupted writer): keep what decompresses.
            import zlib

            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpaceError(where, f"not UTF-8 text (byte {exc.start})") from None


def load_json(text: str, where: str, allow_repair: bool) -> tuple[Any, bool]:
    """Parse JSON; a Kernel Tuner cache cut short is closed after dropping its partial tail."""
    try:
        return json.loads(text), False
    except json.JSONDecodeError as first:
        if not allow_repair:
            raise SpaceError(where, f"invalid JSON: {first.msg} at line {first.lineno}, column {first.colno}") from None
        error = first
    body = text.rstrip()
    # Candidate cut points: ends of complete cache entries ("}," or "}" before a newline).
    cuts: list[int] = []
    pos = len(body)
    while len(cuts) < 64 and pos > 0:
        pos = body.rfind("}", 0, pos)
        if pos < 0:
            break
        cuts.append(pos + 1)
    cache_open = body.find('"cache"')
    if cache_open >= 0:
        brace = body.find("{", cache_open)
        if brace >= 0:
            cuts.append(brace + 1)
    for cut in cuts:
        head = body[:cut].rstrip().rstrip(",")
        for closing in ("\n}\n}", "\n}"):
            try:
                return json.loads(head + closing), True
            except json.JSONDecodeError:
                continue
    raise SpaceError(where, f"invalid JSON that cannot be repaired: {error.msg} at line {error.lineno}, "
                            f"column {error.colno}")


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parameter_spec(name: str, values: Sequence[Any], where: str) -> dict[str, Any]:
    """CRD-shaped parameter for a recorded value list: numbers → ordinal, anything else → categorical."""
    values = list(values)
    if not values:
        raise SpaceError(where, f"parameter {name!r} has no values")
    if permutation_size(values) is not None:
        return {"name": name, "type": "permutation", "size": permutation_size(values)}
    for v in values:
        if not (isinstance(v, (str, bool)) or (is_number(v) and math.isfinite(v))):
            raise SpaceError(where, f"parameter {name!r} has a value of unsupported type: {v!r}")
    if all(is_number(v) for v in values):
        return {"name": name, "type": "ordinal", "values": values}
    return {"name": name, "type": "categorical", "values": values}


def permutation_size(values: Sequence[Any]) -> int | None:
    """n when ``values`` are exactly all permutations of 0..n-1 (as lists), else None."""
    if not all(isinstance(v, (list, tuple)) for v in values):
        return None
    n = len(values[0])
    items = {tuple(v) for v in values}
    if len(items) != len(values) or len(values) != math.factorial(n) or n > 9:
        return None
    return n if all(sorted(v) == list(range(n)) for v in items) else None


def plain_number(v: Any) -> float | None:
    if is_number(v) and math.isfinite(v):
        return float(v)
    return None


def rows_of(space: SearchSpace, records: list[Record], where: str) -> np.ndarray:
    try:
        return space.to_rows([r.config for r in records])
    except SpaceError as exc:
        raise SpaceError(f"{where}: {exc.field}", exc.message) from None


def jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, tuple):
        return list(v)
    return v


def open_for_write(path: str | os.PathLike[str]):
    where = os.fspath(path)
    if where.endswith(".gz"):
        return gzip.open(where, "wt", encoding="utf-8", compresslevel=5)  # level 9 is 3x slower for ~5 %
    return open(where, "w", encoding="utf-8")


def resolve_records(recorded: RecordedSpace | SearchSpace, records: Sequence[Record] | None,
             meta: Mapping[str, Any]) -> tuple[SearchSpace, list[Record], dict[str, Any]]:
    if isinstance(recorded, RecordedSpace):
        base = {"device_name": recorded.device_name, "kernel_name": recorded.kernel_name,
                "problem_size": recorded.problem_size, "objective": recorded.objective}
        base.update({k: v for k, v in meta.items() if v is not None})
        return recorded.space, list(recorded.records if records is None else records), base
    if records is None:
        raise TypeError("records are required when a SearchSpace is given")
    return recorded, list(records), dict(meta)
