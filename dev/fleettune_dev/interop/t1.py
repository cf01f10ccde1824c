"""T1 search-space descriptions (the auto-tuning community's JSON spec) → `SearchSpace`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from fleettune.space.devices import DeviceLimits
from fleettune.space.errors import SpaceError
from fleettune.space.records import load_json, parameter_spec, read_text
from fleettune.space.space import SearchSpace
from fleettune_dev.interop.listexpr import evaluate_values


@dataclass
class T1Spec:
    """A T1 spec as a space: CRD-shaped ``parameters`` and ``constraints`` plus the rest of the file."""

    name: str | None
    parameters: list[dict[str, Any]]
    constraints: list[str]
    space: SearchSpace
    kernel: dict[str, Any] = field(default_factory=dict)  # KernelSpecification
    benchmark: dict[str, Any] = field(default_factory=dict)  # BenchmarkConfig
    warnings: list[str] = field(default_factory=list)


def t1_parameters(doc: dict[str, Any], where: str) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """(parameters, constraints, warnings) of a parsed T1 document."""
    cs = doc.get("ConfigurationSpace")
    if not isinstance(cs, dict):
        raise SpaceError(f"{where}: ConfigurationSpace", "missing; not a T1 spec")
    tps = cs.get("TuningParameters")
    if not isinstance(tps, list) or not tps:
        raise SpaceError(f"{where}: ConfigurationSpace.TuningParameters", "missing or empty")
    params: list[dict[str, Any]] = []
    warnings: list[str] = []
    for i, tp in enumerate(tps):
        f = f"{where}: ConfigurationSpace.TuningParameters[{i}]"
        if not isinstance(tp, dict) or not isinstance(tp.get("Name"), str):
            raise SpaceError(f, "expected an object with Name, Type and Values")
        name = tp["Name"]
        values = evaluate_values(tp.get("Values"), f"{f}.Values")
        ptype = str(tp.get("Type", "")).lower()
        if ptype in ("bool", "boolean"):
            values = [bool(v) for v in values]
        elif ptype in ("float", "double", "real"):
            values = [float(v) for v in values]
        spec = parameter_spec(name, values, f"{f}.Values")
        if "Default" in tp:
            default = tp["Default"]
            if isinstance(default, list) and len(default) == 1:  # some specs wrap it: "Default": [0]
                default = default[0]
            if any(isinstance(default, bool) == isinstance(v, bool) and default == v for v in values):
                spec["default"] = default
            else:
                warnings.append(f"{f}.Default: {default!r} is not one of the values of {name!r}; ignored")
        params.append(spec)
    constraints: list[str] = []
    for i, cond in enumerate(cs.get("Conditions") or []):
        f = f"{where}: ConfigurationSpace.Conditions[{i}]"
        expr = cond.get("Expression") if isinstance(cond, dict) else cond
        if not isinstance(expr, str):
            raise SpaceError(f, "expected an object with an Expression string")
        constraints.append(expr)
    return params, constraints, warnings


def read_t1_spec(path: str | os.PathLike[str], device: DeviceLimits | None = None) -> T1Spec:
    """Read a T1 spec file into a `T1Spec` (its ``.space`` has the conditions as constraints)."""
    where = os.fspath(path)
    doc, _ = load_json(read_text(path), where, allow_repair=False)
    if not isinstance(doc, dict):
        raise SpaceError(where, "not a T1 spec: the top level is not an object")
    params, constraints, warnings = t1_parameters(doc, where)
    try:
        space = SearchSpace.from_spec(params, constraints, device)
    except SpaceError as exc:
        raise SpaceError(f"{where}: {exc.field}", exc.message, exc.position, exc.snippet) from None
    general = doc.get("General") if isinstance(doc.get("General"), dict) else {}
    return T1Spec(name=general.get("BenchmarkName"), parameters=params, constraints=constraints, space=space,
                  kernel=doc.get("KernelSpecification") or {}, benchmark=doc.get("BenchmarkConfig") or {},
                  warnings=warnings)
