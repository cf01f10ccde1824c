"""Kernel Tuner cache files: read (including unterminated ones) and write."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from fleettune.space.errors import SpaceError
from fleettune.space.records import (
    KT_BOOKKEEPING,
    KT_FAILED_TIME,
    KT_FAILURE_IN,
    KT_FAILURE_OUT,
    Record,
    RecordedSpace,
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


def read_kernel_tuner_cache(path: str | os.PathLike[str]) -> RecordedSpace:
    """Read a Kernel Tuner cache (``.json`` or ``.json.gz``, also when unterminated)."""
    return parse_kernel_tuner_cache(read_text(path), os.fspath(path))


def parse_kernel_tuner_cache(text: str, where: str) -> RecordedSpace:
    """A Kernel Tuner cache from its JSON text; ``where`` names it in errors."""
    data, _ = load_json(text, where, allow_repair=True)
    if not isinstance(data, dict):
        raise SpaceError(where, "not a Kernel Tuner cache: the top level is not an object")
    tune_params = data.get("tune_params")
    if not isinstance(tune_params, dict) or not tune_params:
        raise SpaceError(f"{where}: tune_params", "missing or empty; not a Kernel Tuner cache")
    keys = data.get("tune_params_keys") or list(tune_params)
    if not isinstance(keys, list) or set(keys) != set(tune_params):
        raise SpaceError(f"{where}: tune_params_keys", "does not list the same names as tune_params")
    params = [parameter_spec(k, tune_params[k], f"{where}: tune_params.{k}") for k in keys]
    space = SearchSpace.from_spec(params, [])
    cache = data.get("cache", {})
    if not isinstance(cache, dict):
        raise SpaceError(f"{where}: cache", "is not an object")
    by_str = [{str(v): v for v in p.values} for p in space.parameters]
    records: list[Record] = []
    for key, entry in cache.items():
        if not isinstance(entry, dict):
            raise SpaceError(f"{where}: cache[{key!r}]", "is not an object")
        parts = str(key).split(",")
        config: dict[str, Any] = {}
        for j, name in enumerate(keys):
            if name in entry:
                config[name] = entry[name]
            elif len(parts) == len(keys) and parts[j] in by_str[j]:
                config[name] = by_str[j][parts[j]]
            else:
                raise SpaceError(f"{where}: cache[{key!r}]", f"has no value for parameter {name!r}")
        raw_time = entry.get("time")
        failure = None
        time_ms = None
        if isinstance(raw_time, str):
            failure = KT_FAILURE_IN.get(raw_time, "runtime")
        elif (number := plain_number(raw_time)) is not None and number < KT_FAILED_TIME:
            time_ms = number
        else:
            failure = "runtime"
        times = entry.get("times") or []
        if not (isinstance(times, list) and all(type(t) is float for t in times)):
            times = [float(t) for t in times if plain_number(t) is not None] if isinstance(times, list) else []
        extras = {k: v for k, v in entry.items() if k not in KT_BOOKKEEPING and k not in config}
        if isinstance(raw_time, str) and raw_time not in KT_FAILURE_IN:
            extras["time"] = raw_time
        records.append(Record(config=config, time_ms=time_ms, failure=failure, times=times, extras=extras))
    rows = rows_of(space, records, where)
    return RecordedSpace(space=space, records=records, device_name=data.get("device_name"),
                         kernel_name=data.get("kernel_name"), problem_size=data.get("problem_size"),
                         rows=rows, objective=data.get("objective") or "time",
                         metadata={k: v for k, v in data.items()
                                   if k not in ("cache", "tune_params", "tune_params_keys")})


def write_kernel_tuner_cache(path: str | os.PathLike[str], recorded: RecordedSpace | SearchSpace,
                             records: Sequence[Record] | None = None, *, device_name: str | None = None,
                             kernel_name: str | None = None, problem_size: Any = None,
                             objective: str | None = None) -> None:
    """Write records as a Kernel Tuner cache (gzip when the path ends in ``.gz``).

    One entry per line, as Kernel Tuner writes it, so a partial file stays readable.
    """
    space, recs, meta = resolve_records(recorded, records, {"device_name": device_name, "kernel_name": kernel_name,
                                                     "problem_size": problem_size, "objective": objective})
    header = {
        "device_name": meta.get("device_name") or "",
        "kernel_name": meta.get("kernel_name") or "",
        "problem_size": jsonable(meta.get("problem_size")) if meta.get("problem_size") is not None else [],
        "tune_params_keys": list(space.names),
        "tune_params": {p.name: [jsonable(v) for v in p.values] for p in space.parameters},
        "objective": meta.get("objective") or "time",
    }
    lines = ["{"] + [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in header.items()] + ['"cache": {']
    entries = []
    rows = space.to_rows([r.config for r in recs])
    for r, row, config in zip(recs, rows, space.to_configs(rows), strict=True):
        entry: dict[str, Any] = {name: jsonable(v) for name, v in config.items()}
        entry.update({k: jsonable(v) for k, v in r.extras.items() if k not in entry})
        entry["time"] = KT_FAILURE_OUT.get(r.failure, "RuntimeFailedConfig") if r.failure is not None else r.time_ms
        if r.times or r.failure is None:
            entry["times"] = list(r.times)
        entries.append(f"{json.dumps(space.key(row))}: {json.dumps(entry)}")
    text = "\n".join(lines) + "\n" + ",\n".join(entries) + "\n}\n}\n"
    with open_for_write(path) as fh:
        fh.write(text)


