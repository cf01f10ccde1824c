"""T4 results files (the auto-tuning community's results schema): read and write.

Timings that both formats know are stored in `Record.extras` under Kernel Tuner's names
(``compile_time``, ``verification_time``, ``benchmark_time``, ``strategy_time``,
``framework_time``, ``timestamp``) so that a T4 file can be written back as a Kernel Tuner cache
and vice versa without losing them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

from fleettune.space.errors import SpaceError
from fleettune.space.records import (
    KT_FAILURE_IN,
    KT_FAILURE_OUT,
    Record,
    RecordedSpace,
    is_number,
    jsonable,
    load_json,
    open_for_write,
    parameter_spec,
    plain_number,
    read_text,
    resolve_records,
    rows_of,
)
from fleettune.space.space import SearchSpace

# T4 invalidity ↔ a recorded failure (see `records.FAILURES`).
T4_FAILURE_IN = {"compile": "compile", "runtime": "runtime", "correctness": "runtime", "timeout": "runtime",
                 "constraints": "invalid"}
T4_FAILURE_OUT = {"compile": "compile", "runtime": "runtime", "invalid": "constraints"}
# T4 "times" entry → Kernel Tuner record field.
T4_TIMES = {"compilation": "compile_time", "validation": "verification_time", "benchmark": "benchmark_time",
            "search_algorithm": "strategy_time", "framework": "framework_time"}
SCHEMA_VERSION = "1.0.0"


def _sorted_values(values: list[Any]) -> list[Any]:
    if all(is_number(v) for v in values):
        return sorted(values)
    return values


def read_t4(path: str | os.PathLike[str]) -> RecordedSpace:
    """Read a T4 results file; the space has one ordinal/categorical parameter per configuration key."""
    return parse_t4(read_text(path), os.fspath(path))


def parse_t4(text: str, where: str) -> RecordedSpace:
    """A T4 results file from its JSON text; ``where`` names it in errors."""
    data, _ = load_json(text, where, allow_repair=False)
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise SpaceError(f"{where}: results", "missing; not a T4 results file")
    names: list[str] = []
    seen: dict[str, dict[Any, Any]] = {}
    for i, res in enumerate(results):
        config = res.get("configuration") if isinstance(res, dict) else None
        if not isinstance(config, dict):
            raise SpaceError(f"{where}: results[{i}].configuration", "missing or not an object")
        for name, value in config.items():
            if name not in seen:
                names.append(name)
                seen[name] = {}
            key = (type(value) is bool, value) if not isinstance(value, list) else ("list", tuple(value))
            seen[name].setdefault(key, value)
    if not names:
        raise SpaceError(f"{where}: results", "no configurations")
    params = [parameter_spec(n, _sorted_values(list(seen[n].values())), f"{where}: configuration.{n}") for n in names]
    space = SearchSpace.from_spec(params, [])
    metadata = data.get("metadata") if isinstance(data.get("metadata"), dict) else {}
    records: list[Record] = []
    objective = "time"
    for res in results:
        objectives = res.get("objectives") or ["time"]
        objective = str(objectives[0])
        value = None
        for m in res.get("measurements") or []:
            if isinstance(m, dict) and m.get("name") == objective:
                value = m.get("value")
                break
        invalidity = str(res.get("invalidity", "correct"))
        failure = None
        time_ms = None
        if invalidity != "correct":
            failure = T4_FAILURE_IN.get(invalidity, "runtime")
        elif isinstance(value, str):
            failure = KT_FAILURE_IN.get(value, "runtime")
        elif plain_number(value) is not None:
            time_ms = float(value)
        else:
            failure = "runtime"
        times_block = res.get("times") if isinstance(res.get("times"), dict) else {}
        runtimes = [float(t) for t in times_block.get("runtimes") or [] if plain_number(t) is not None]
        extras: dict[str, Any] = {T4_TIMES[k]: v for k, v in times_block.items() if k in T4_TIMES}
        if "timestamp" in res:
            extras["timestamp"] = res["timestamp"]
        if failure is not None and T4_FAILURE_OUT.get(failure) != invalidity and invalidity != "correct":
            extras["t4_invalidity"] = invalidity  # e.g. "correctness": keep the finer T4 reason
        records.append(Record(config=dict(res["configuration"]), time_ms=time_ms, failure=failure,
                              times=runtimes, extras=extras))
    rows = rows_of(space, records, where)
    return RecordedSpace(space=space, records=records,
                         device_name=metadata.get("device_name") or metadata.get("device"),
                         kernel_name=metadata.get("kernel_name") or metadata.get("kernel"),
                         problem_size=metadata.get("problem_size"), rows=rows, objective=objective,
                         metadata=dict(metadata))


def write_t4(path: str | os.PathLike[str], recorded: RecordedSpace | SearchSpace,
             records: Sequence[Record] | None = None, *, metadata: dict[str, Any] | None = None,
             objective: str | None = None) -> None:
    """Write records as a T4 results file (gzip when the path ends in ``.gz``)."""
    space, recs, meta = resolve_records(recorded, records, {"objective": objective})
    objective = meta.get("objective") or "time"
    md: dict[str, Any] = {}
    if isinstance(recorded, RecordedSpace):
        md.update(recorded.metadata)
        for key in ("device_name", "kernel_name", "problem_size"):
            if getattr(recorded, key) is not None and key not in md:
                md[key] = jsonable(getattr(recorded, key))
    md.update(metadata or {})
    md.setdefault("timeunit", "milliseconds")
    unit = md["timeunit"]
    results = []
    rows = space.to_rows([r.config for r in recs])
    for r, plain in zip(recs, space.to_configs(rows), strict=True):
        config = {k: jsonable(v) for k, v in plain.items()}
        times: dict[str, Any] = {t4: r.extras[kt] for t4, kt in T4_TIMES.items() if kt in r.extras}
        if r.failure is None:
            times["runtimes"] = list(r.times)
            value: Any = r.time_ms
            invalidity = "correct"
        else:
            value = KT_FAILURE_OUT.get(r.failure, "RuntimeFailedConfig")
            invalidity = r.extras.get("t4_invalidity") or T4_FAILURE_OUT.get(r.failure, "runtime")
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        results.append({
            "timestamp": r.extras.get("timestamp", ""),
            "configuration": config,
            "times": times,
            "invalidity": invalidity,
            "correctness": 1 if r.failure is None else 0,
            "measurements": [{"name": objective, "value": value, "unit": unit}],
            "objectives": [objective],
        })
    doc = {"schema_version": SCHEMA_VERSION, "metadata": md, "results": results}
    with open_for_write(path) as fh:
        json.dump(doc, fh, indent=1)
