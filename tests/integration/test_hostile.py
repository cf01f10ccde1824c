"""Hostile TuningRun manifests against the real API server and the real operator.

Generated invalid manifests (hypothesis, fixed seed, a few hundred in all) must each be
rejected by the API server naming the field, or end with ``Ready=False,
reason=InvalidSpec`` naming a ``spec.…`` field — never an operator crash, a traceback or
a run that silently never gets a status.

* What the CRD schema can check is sent with ``dryRun=All`` (fast: nothing is stored).
* What only the operator can check (constraint expressions, value types, device limits,
  strategy options) is first put through the operator's own code path for one run
  (``RunLoop._configure`` and ``_setup_pool`` against the real API server, then one
  suggestion) for every generated case, and a sample is created for real in one
  namespace watched by one operator process.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fault_support import tracebacks
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from operator_support import ChartIdentity, OperatorProcess, example, install_crd

from fleettune import GROUP, PLURAL, VERSION

pytestmark = pytest.mark.integration

# Failures are collected, not raised: one report of every failing case instead of a slow
# shrink of the first (the cases are already small, single-fault mutations).
HYPOTHESIS = settings(derandomize=True, database=None, deadline=None, print_blob=False,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


def _base() -> dict[str, Any]:
    # Two trials at once: the first step measures the default configuration *and* asks the
    # strategy for a suggestion, so errors of the strategy surface in that step.
    doc = example("hostile", trialsPerTarget=2, parallelism=2)
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == "a100"]
    doc["spec"]["strategy"] = {"name": "random", "seed": 1}
    doc["apiVersion"], doc["kind"] = f"{GROUP}/{VERSION}", "TuningRun"
    return doc


_BASE = _base()


def base_doc() -> dict[str, Any]:
    """The example, on the A100 pool only, two cheap trials: a valid starting point."""
    return copy.deepcopy(_BASE)


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hostile_ns(cluster, api_client) -> Iterator[str]:
    from kubernetes import client

    install_crd(cluster)
    name = f"hostile-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name, "labels": {"fleettune.dev/test": "true"}}})
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def inproc_ns(cluster, api_client) -> Iterator[str]:
    """A namespace no operator watches: the tests run single tuning steps in process there."""
    from kubernetes import client

    name = f"hostile-inproc-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name, "labels": {"fleettune.dev/test": "true"}}})
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="module")
def hostile_operator(cluster, hostile_ns, tmp_path_factory) -> Iterator[OperatorProcess]:
    workdir = tmp_path_factory.mktemp("hostile-operator")
    identity = ChartIdentity(cluster, hostile_ns, workdir)
    proc = OperatorProcess(identity.kubeconfig, hostile_ns, workdir)
    proc.start()
    yield proc
    alive = proc.proc is not None and proc.proc.poll() is None
    proc.stop()
    identity.remove()
    assert alive, "the operator died during the hostile-input tests:\n" + proc.logs()[-4000:]


@pytest.fixture(scope="module")
def custom(api_client) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(api_client)


def dry_run(custom: Any, namespace: str, doc: dict[str, Any]) -> tuple[int, str]:
    """(HTTP status, message) of a server-side dry-run create; (201, "") when accepted."""
    from kubernetes.client import ApiException

    try:
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc, dry_run="All",
                                               field_validation="Strict", _request_timeout=30)
    except ApiException as exc:
        try:
            message = json.loads(exc.body).get("message", exc.body)
        except (TypeError, ValueError):
            message = str(exc.body)
        return exc.status, message
    return 201, ""


# ---------------------------------------------------------------------------- API-server cases

# (path in the spec, JSON-pointer-ish location, minimum, maximum)
INT_FIELDS = [
    ("budget.trialsPerTarget", 1, 100_000), ("budget.parallelism", 1, 256),
    ("budget.maxInfraFailures", 0, 100_000), ("budget.trialTimeoutSeconds", 1, 86_400),
    ("budget.patience", 1, 100_000), ("kernel.warmups", 0, 1000), ("kernel.repeats", 1, 1000),
    ("strategy.seed", 0, 2**31 - 1), ("jobTemplate.ttlSecondsAfterFinished", 0, 604_800),
    ("jobTemplate.backoffLimit", 0, 10), ("targets[0].gpus", 1, 16),
]
STRING_FIELDS = ["kernel.builtin", "targets[0].name", "strategy.name", "retunePolicy", "parameters[0].name",
                 "jobTemplate.image", "parameters[0].type", "targets[0].image", "constraints[0]"]
ENUM_FIELDS = {
    "parameters[0].type": ["integer", "ordinal", "real", "categorical", "boolean", "permutation"],
    "strategy.name": ["bayes", "random", "genetic"], "retunePolicy": ["Manual", "OnDriverChange"],
    "jobTemplate.imagePullPolicy": ["Always", "IfNotPresent", "Never"], "objective.metric": ["time"],
    "objective.direction": ["minimize"], "parameters[1].scale": ["linear", "log"],
}
PATTERN_FIELDS = {  # field: (regex it must match, max length)
    "parameters[2].name": (r"^[A-Za-z_][A-Za-z0-9_]*$", 63),
    "targets[0].name": (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", 24),
    "kernel.builtin": (r"^[A-Za-z_][A-Za-z0-9_]*$", 63),
}
LIST_FIELDS = {  # field: (min items, max items, item factory)
    "parameters": (1, 64, lambda i: {"name": f"p{i}", "values": [1, 2]}),
    "targets": (1, 16, lambda i: {"name": f"t{i}", "nodeSelector": {"fleettune.dev/pool": "a100"}}),
    "kernel.problemSize": (1, 3, lambda i: 64),
    "constraints": (0, 256, lambda i: f"block_size_x >= {i % 16}"),
    "parameters[0].values": (1, 4096, lambda i: i),
    "targets[0].tolerations": (0, 32, lambda i: {"key": f"k{i}", "operator": "Exists"}),
}
REQUIRED = ["kernel", "parameters", "targets", "kernel.problemSize", "parameters[3].name", "targets[0].name"]

_PART = re.compile(r"([A-Za-z][A-Za-z0-9]*)(?:\[(\d+)\])?")


def _walk(spec: dict[str, Any], path: str) -> tuple[Any, str | int]:
    """(container, key) of a dotted path with [i] indexes, e.g. targets[0].name."""
    node: Any = spec
    parts = path.split(".")
    for part in parts[:-1]:
        m = _PART.fullmatch(part)
        assert m, part
        node = node.setdefault(m.group(1), {})
        if m.group(2) is not None:
            node = node[int(m.group(2))]
    m = _PART.fullmatch(parts[-1])
    assert m, parts[-1]
    if m.group(2) is not None:
        return node[m.group(1)], int(m.group(2))
    return node, m.group(1)


def _set(spec: dict[str, Any], path: str, value: Any) -> None:
    container, key = _walk(spec, path)
    container[key] = value


JSON_SCALARS = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=12))
NOT_INT = st.one_of(st.text(min_size=1, max_size=12), st.booleans(), st.lists(st.integers(), max_size=3),
                    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
                    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != int(f)))
NOT_STRING = st.one_of(st.integers(), st.booleans(), st.lists(st.text(max_size=3), max_size=3),
                       st.dictionaries(st.text(max_size=4), st.integers(), max_size=2), st.floats(allow_nan=False))


@st.composite
def api_rejected(draw: st.DrawFn) -> tuple[dict[str, Any], str, str]:
    """(manifest, what was broken, text the API server's error must contain)."""
    doc = base_doc()
    spec = doc["spec"]
    kind = draw(st.sampled_from(["range", "int-type", "str-type", "enum", "pattern", "length", "list", "required",
                                 "cel", "unknown"]))
    if kind == "range":
        path, lo, hi = draw(st.sampled_from(INT_FIELDS))
        value = draw(st.one_of(st.integers(lo - 10**12, lo - 1), st.integers(hi + 1, hi + 10**12)))
        _set(spec, path, value)
        return doc, f"{path}={value}", f"spec.{path}"
    if kind == "int-type":
        path, _, _ = draw(st.sampled_from(INT_FIELDS))
        _set(spec, path, draw(NOT_INT))
        return doc, f"{path} not an integer", f"spec.{path}"
    if kind == "str-type":
        path = draw(st.sampled_from(STRING_FIELDS))
        _set(spec, path, draw(NOT_STRING))
        return doc, f"{path} not a string", f"spec.{path}"
    if kind == "enum":
        path = draw(st.sampled_from(sorted(ENUM_FIELDS)))
        value = draw(st.text(min_size=1, max_size=16).filter(lambda v, p=path: v not in ENUM_FIELDS[p]))
        _set(spec, path, value)
        return doc, f"{path}={value!r}", f"spec.{path}"
    if kind == "pattern":
        path = draw(st.sampled_from(sorted(PATTERN_FIELDS)))
        regex, max_len = PATTERN_FIELDS[path]
        value = draw(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1,
                             max_size=max_len).filter(lambda v, r=regex: not re.match(r, v)))
        _set(spec, path, value)
        return doc, f"{path}={value!r}", f"spec.{path}"
    if kind == "length":
        path, limit = draw(st.sampled_from([("targets[0].name", 24), ("parameters[0].name", 63),
                                            ("jobTemplate.image", 512), ("constraints[0]", 2048),
                                            ("targets[0].runtimeClassName", 253), ("kernel.builtin", 63)]))
        n = draw(st.integers(limit + 1, limit * 4))
        _set(spec, path, "a" * n)
        return doc, f"{path} of {n} characters", f"spec.{path}"
    if kind == "list":
        path = draw(st.sampled_from(sorted(LIST_FIELDS)))
        lo, hi, item = LIST_FIELDS[path]
        choices = [hi + 1, hi + draw(st.integers(2, 3 * hi))] + ([lo - 1] if lo > 0 else [])
        n = draw(st.sampled_from(choices))
        _set(spec, path, [item(i) for i in range(n)])
        return doc, f"{path} with {n} items", f"spec.{path}"
    if kind == "required":
        path = draw(st.sampled_from(REQUIRED))
        container, key = _walk(spec, path)
        del container[key]
        return doc, f"no {path}", f"spec.{path}"
    if kind == "cel":
        case = draw(st.sampled_from(["dup-param", "dup-target", "min>max", "no-range", "no-size", "two-sources",
                                     "no-source"]))
        if case == "dup-param":
            spec["parameters"].append(copy.deepcopy(spec["parameters"][draw(st.integers(0, 9))]))
            return doc, case, "parameter names must be unique"
        if case == "dup-target":
            spec["targets"].append(copy.deepcopy(spec["targets"][0]))
            return doc, case, "target names must be unique"
        if case == "min>max":
            lo = draw(st.floats(-1e9, 1e9))
            hi = draw(st.floats(-1e12, lo).filter(lambda v, lo=lo: v < lo))
            spec["parameters"].append({"name": "r", "type": draw(st.sampled_from(["integer", "real"])),
                                       "range": {"min": lo, "max": hi}})
            return doc, case, "min > max"
        if case == "no-range":
            spec["parameters"].append({"name": "r", "type": draw(st.sampled_from(["integer", "real"]))})
            return doc, case, "need a range"
        if case == "no-size":
            spec["parameters"].append({"name": "perm", "type": "permutation"})
            return doc, case, "need a size"
        if case == "two-sources":
            spec["kernel"]["source"] = {"configMap": "k", "function": "f", "grid": ["1"], "block": ["1"],
                                        "arguments": [{"name": "out", "length": "8", "output": True}]}
            return doc, case, "exactly one of kernel.builtin, kernel.source or kernel.triton"
        del spec["kernel"]["builtin"]
        return doc, case, "exactly one of kernel.builtin, kernel.source or kernel.triton"
    # An unknown field anywhere typed: a typo must not be silently dropped.
    where = draw(st.sampled_from(["", "budget.", "kernel.", "parameters[0].", "targets[0].", "strategy.",
                                  "jobTemplate.", "objective."]))
    key = draw(st.from_regex(r"\A[a-z][A-Za-z0-9]{0,12}\Z").filter(
        lambda k: k not in json.dumps(spec) and k not in ("objective", "budget", "kernel", "strategy")))
    container, last = _walk(spec, where + key) if where else (spec, key)
    container[last] = draw(JSON_SCALARS)
    return doc, f"unknown field {where}{key}", f'unknown field "spec.{where}{key}"'


def test_api_server_rejects_generated_invalid_manifests_naming_the_field(custom, hostile_ns):
    seen: list[str] = []
    failures: list[str] = []

    @settings(HYPOTHESIS, max_examples=300)
    @given(api_rejected())
    def check(case: tuple[dict[str, Any], str, str]) -> None:
        doc, what, expected = case
        seen.append(what)
        status, message = dry_run(custom, hostile_ns, doc)
        if status not in (400, 422):
            failures.append(f"{what}: accepted by the API server (HTTP {status})")
        elif expected not in message:
            failures.append(f"{what}: the error does not name {expected!r}: {message[:300]}")

    check()
    assert len(seen) >= 250
    assert not failures, f"{len(failures)} of {len(seen)} cases:\n" + "\n".join(failures[:15])


def test_oversized_specs_get_a_clear_limit_error(custom, hostile_ns):
    huge_values = base_doc()
    huge_values["spec"]["parameters"][0]["values"] = list(range(100_000))
    many_params = base_doc()
    many_params["spec"]["parameters"] = [{"name": f"p{i}", "values": [1, 2, 4]} for i in range(5000)]
    many_constraints = base_doc()
    many_constraints["spec"]["constraints"] = [f"block_size_x != {i}" for i in range(5000)]
    for doc, field, limit in [(huge_values, "spec.parameters[0].values", "4096"),
                              (many_params, "spec.parameters", "64"),
                              (many_constraints, "spec.constraints", "256")]:
        status, message = dry_run(custom, hostile_ns, doc)
        assert status == 422, (field, status, message[:300])
        assert field in message and f"must have at most {limit} items" in message, message[:300]
    # Beyond the API server's request size limit (3 MiB): refused before any schema check.
    giant = base_doc()
    giant["spec"]["parameters"][0] = {"name": "blob", "type": "categorical",
                                      "values": ["x" * 1000 + str(i) for i in range(4000)]}
    status, message = dry_run(custom, hostile_ns, giant)
    assert status == 413 and "too large" in message.lower(), (status, message[:300])


# ---------------------------------------------------------------------------- operator cases

PARAM_NAMES = ["block_size_x", "block_size_y", "tile_size_x", "tile_size_y", "read_only", "use_padding",
               "use_shmem", "use_cmem", "filter_height", "filter_width"]


def code_payloads(marker: Path) -> list[str]:
    """Constraint expressions that would run code, read files or exhaust memory if evaluated."""
    m = str(marker)
    return [
        f"__import__('os').system('touch {m}')",
        f"open('{m}', 'w').write('x')",
        "().__class__.__bases__[0].__subclasses__()",
        "block_size_x.__class__.__mro__",
        "(lambda: 1)() == 1",
        "[c for c in ().__class__.__base__.__subclasses__()]",
        "eval('1 + 1') == 2",
        "exec('import os')",
        "getattr(block_size_x, 'real') > 0",
        "globals()['__builtins__']",
        "block_size_x if (x := 3) else 0",
        "f'{block_size_x}' == '16'",
        "'a' * 10 ** 10 == ''",
        "10 ** 10 ** 10 > block_size_x",
        "2 ** 2 ** 2 ** 2 ** 2 ** 2 > 0",
        "block_size_x << 100000000 > 0",
        "import os",
        "block_size_x; import os",
        "__builtins__",
        "device.__class__",
        "device.max_threads_per_block.__add__(1) > 0",
        "sum(range(10 ** 12)) > 0",
        "[0] * 10 ** 10",
    ]


@st.composite
def hostile_constraint(draw: st.DrawFn, marker: Path) -> str:
    kind = draw(st.sampled_from(["payload", "payload", "unknown-name", "garbage", "nesting", "types"]))
    if kind == "payload":
        return draw(st.sampled_from(code_payloads(marker)))
    if kind == "unknown-name":
        name = draw(st.from_regex(r"\A[a-z_][a-z0-9_]{0,10}\Z").filter(
            lambda n: n not in PARAM_NAMES and n not in ("and", "or", "not", "in", "is", "if", "else", "lambda")))
        return f"{name} {draw(st.sampled_from(['>', '==', '<=', '!=']))} {draw(st.integers(-5, 99))}"
    if kind == "garbage":
        return draw(st.text("()[]{}+-*/%<>=!&|^~.,:;'\" abcxyz019_@#$\\", min_size=1, max_size=60))
    if kind == "nesting":
        depth = draw(st.integers(61, 600))
        return "(" * depth + "block_size_x" + ")" * depth + " > 0"
    return draw(st.sampled_from(["block_size_x + 'a' > 0", "block_size_x > 'a'", "block_size_x / 0 > 1",
                                 "block_size_x", "'yes'", "None", "[block_size_x] > 0", "{1: 2}",
                                 "block_size_x @ 2 > 0", "not_a_param.attr > 0", "device.no_such_limit > 0"]))


@st.composite
def bad_values(draw: st.DrawFn) -> list[Any]:
    return draw(st.sampled_from([
        [{"a": 1}], [[1, 2], [3]], [1, "a", 2.5], [None], [True, 2], [1.5, "x"], ["16"] * 3,
        [1e308, -1e308], [{"nested": {"deep": [1]}}, 2], [1, 1, 1], [2**70], [float(i) / 3 for i in range(5)],
    ]))


OPTION_KEYS = ["population", "mutation", "tournament", "initial", "max_pool", "fit_iter", "local_starts",
               "local_rounds", "refit_growth", "feas_power", "tau_max", "prior_top", "transform", "bogus"]


@st.composite
def operator_case(draw: st.DrawFn, family: str, marker: Path) -> tuple[dict[str, Any], str]:
    """(manifest the API server accepts, the field the operator's condition must name)."""
    doc = base_doc()
    spec = doc["spec"]
    if family == "constraints":
        spec["constraints"].append(draw(hostile_constraint(marker)))
        return doc, f"spec.constraints[{len(spec['constraints']) - 1}]"
    if family == "parameters":
        i = draw(st.integers(0, len(spec["parameters"]) - 1))
        kind = draw(st.sampled_from(["values", "type", "name", "range", "permutation"]))
        p = spec["parameters"][i]
        spec["kernel"].pop("defaultConfig")  # its errors would name another field first
        if kind == "values":
            p["values"] = draw(bad_values())
        elif kind == "type":
            p["type"] = draw(st.sampled_from(["boolean", "integer", "real", "permutation"]))
            p.setdefault("range", {"min": 0, "max": draw(st.sampled_from([1, 10**9, 10**15]))})
            p.setdefault("size", draw(st.integers(2, 12)))
        elif kind == "name":
            # A new parameter, so that no constraint or default config names a renamed one.
            spec["parameters"].append({"name": draw(st.sampled_from(
                ["device", "True", "None", "min", "max", "abs", "and", "lambda", "__class__", "__import__",
                 "problem_size", "if", "not", "in"])), "values": [0, 1]})
            i = len(spec["parameters"]) - 1
        elif kind == "range":
            # Finite value counts only: a non-finite one is test_non_finite_range_is_a_spec_error.
            spec["parameters"].append({"name": "r", "type": draw(st.sampled_from(["integer", "real"])),
                                       "range": {"min": 0, "max": draw(st.sampled_from([10**7, 10**12, 1e300])),
                                                 **draw(st.sampled_from([{}, {"step": 1e-3}, {"step": 0.5}]))}})
            i = len(spec["parameters"]) - 1
        else:
            spec["parameters"].append({"name": "perm", "type": "permutation", "size": draw(st.integers(10, 12))})
            i = len(spec["parameters"]) - 1
        return doc, f"spec.parameters[{i}]"
    if family == "default":
        default = spec["kernel"]["defaultConfig"]
        kind = draw(st.sampled_from(["unknown-key", "missing-key", "bad-value", "violates", "wrong-type"]))
        if kind == "unknown-key":
            default[draw(st.from_regex(r"\A[a-z]{3,8}\Z"))] = 1
        elif kind == "missing-key":
            del default[draw(st.sampled_from(PARAM_NAMES))]
        elif kind == "bad-value":
            default[draw(st.sampled_from(PARAM_NAMES))] = draw(st.sampled_from([7, -1, 10**9, "x", [1]]))
        elif kind == "violates":
            default.update(block_size_x=256, block_size_y=16)  # 4096 threads > any device's 1024
        else:
            default[draw(st.sampled_from(PARAM_NAMES))] = {"x": 1}
        return doc, "spec.kernel.defaultConfig"
    if family == "device":
        spec["targets"][0]["device"] = draw(st.sampled_from(["Voodoo 5 6000", "NVIDIA GeForce 256", "x", "' or 1=1",
                                                             "A100" * 30, "../../etc/passwd"]))
        return doc, "spec.targets[0].device"
    if family == "options":
        spec["strategy"] = {"name": draw(st.sampled_from(["bayes", "random", "genetic"])), "seed": 1,
                            "options": {draw(st.sampled_from(OPTION_KEYS)): draw(st.sampled_from(
                                ["many", -1, 0, 10**12, None, [1], {"a": 1}, 1e308]))}}
        return doc, "spec.strategy.options"
    raise AssertionError(family)


def describe(doc: dict[str, Any], field: str) -> str:
    """The hostile part of a case, e.g. `spec.constraints[4]='__import__(...)'`."""
    try:
        container, key = _walk(doc["spec"], field.removeprefix("spec."))
        value = container[key]
    except (KeyError, IndexError, TypeError):
        value = "?"
    return f"{field}={json.dumps(value)[:120]}"


def step_once(api: Any, custom: Any, namespace: str, name: str, doc: dict[str, Any]) -> dict[str, Any] | None:
    """Create the run for real and run one tuning step of the operator's own loop on it, in process.

    The namespace is not watched by the operator process, so only this step acts on the
    run. Exceptions propagate: in the operator, each would be a logged traceback and the
    step retried every few seconds, forever. Returns the status the step wrote.
    """
    from fleettune.controller.kube import Kube
    from fleettune.controller.tuner import RunLoop

    doc = copy.deepcopy(doc)
    doc["metadata"] = {"name": name}
    body = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
    loop = RunLoop(Kube(api), body, logging.getLogger("hostile"))
    try:
        asyncio.run(loop.step())
    finally:
        # Valid cases started Jobs: let the garbage collector take them, nothing answers them.
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return loop.last_status


def verdict(status: dict[str, Any] | None, field: str) -> str | None:
    """What is wrong with a run's status for a case whose error must name ``field``; None if fine."""
    ready = next((c for c in (status or {}).get("conditions", []) if c["type"] == "Ready"), None)
    if ready is None:
        return "no Ready condition"
    if ready["reason"] == "InvalidSpec":
        if ready["status"] != "False" or not ready["message"].startswith(field):
            return f"InvalidSpec does not name {field}: {ready['message'][:200]}"
        return None
    if (status or {}).get("phase") not in ("Running", "Succeeded"):
        return f"phase {status.get('phase') if status else None} ({ready['reason']}: {ready['message'][:200]})"
    return None


WAIT_S = 45


def _wait_conditions(custom: Any, namespace: str, names: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Each run's status once it has a terminal or running verdict (or what it has at the deadline)."""
    deadline = time.monotonic() + timeout
    runs: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        items = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        runs = {r["metadata"]["name"]: r for r in items if r["metadata"]["name"] in names}
        if all((runs.get(n, {}).get("status") or {}).get("phase") in ("Failed", "Running", "Succeeded")
               for n in names):
            break
        time.sleep(1)
    return runs


def create_and_check(custom: Any, namespace: str, prefix: str,
                     cases: list[tuple[dict[str, Any], str]]) -> tuple[list[str], list[str]]:
    """Create each run for real; (what went wrong, run names) once each has a verdict or WAIT_S passed."""
    names = []
    for k, (doc, field) in enumerate(cases):
        doc = copy.deepcopy(doc)
        doc["metadata"] = {"name": f"{prefix}-{k}", "annotations": {"hostile/field": field}}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)
        names.append(doc["metadata"]["name"])
    runs = _wait_conditions(custom, namespace, names, WAIT_S)
    problems = []
    for name in names:
        run = runs.get(name, {})
        field = run.get("metadata", {}).get("annotations", {}).get("hostile/field", "?")
        if not run.get("status"):
            problems.append(f"{name}: no status after {WAIT_S} s (expected InvalidSpec naming {field})")
        elif (wrong := verdict(run["status"], field)) is not None:
            problems.append(f"{name}: {wrong}")
    return problems, names


def report_of(operator: OperatorProcess, prefix: str, failures: list[str], n_cases: int, problems: list[str],
              names: list[str]) -> list[str]:
    mine = [t for t in tracebacks(operator.logs()) if f"/{prefix}-" in t]
    report = []
    if failures:
        report += [f"{len(failures)} of {n_cases} cases fail in the operator's own code path:", *failures[:10]]
    if problems:
        report += [f"{len(problems)} of {len(names)} runs created for real:", *problems[:10]]
    if mine:
        report += [f"{len(mine)} tracebacks in the operator's log for these runs, e.g.:", mine[0]]
    return report


def check_family(api_client: Any, custom: Any, namespace: str, inproc_ns: str, operator: OperatorProcess,
                 family: str, examples: int, sample: int, tmp_path: Path) -> None:
    marker = tmp_path / f"pwned-{family}"
    cases: list[tuple[dict[str, Any], str]] = []
    failures: list[str] = []

    @settings(HYPOTHESIS, max_examples=examples)
    @given(operator_case(family, marker))
    def check(case: tuple[dict[str, Any], str]) -> None:
        doc, field = case
        status, message = dry_run(custom, namespace, doc)
        if status != 201:  # the API server may know better than the case generator: then it must say where
            if "spec." not in message:
                failures.append(f"API server error without a field: {message[:200]}")
            return
        cases.append(case)
        what = describe(doc, field)
        try:
            status = step_once(api_client, custom, inproc_ns, f"{family}-{len(cases)}", doc)
        except Exception as exc:  # in the operator: a traceback, and the step retried forever
            failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
            return
        if (wrong := verdict(status, field)) is not None:
            failures.append(f"{what}: {wrong}")

    check()
    # Not vacuous: most generated cases get past the API server and into the operator.
    assert len(cases) >= examples // 3, f"only {len(cases)} of {examples} cases were accepted by the API server"
    assert not marker.exists(), "a constraint expression executed code"

    # A sample, for real: created in the namespace the operator watches.
    stride = max(1, len(cases) // sample)
    problems, names = create_and_check(custom, namespace, family, cases[::stride][:sample])
    assert operator.proc is not None and operator.proc.poll() is None, "operator died:\n" + operator.logs()[-3000:]
    assert not marker.exists(), "a constraint expression executed code"
    report = report_of(operator, family, failures, len(cases), problems, names)
    assert not report, "\n".join(report)


def test_code_and_garbage_in_constraints_is_rejected_naming_the_constraint(
        api_client, custom, hostile_ns, inproc_ns, hostile_operator, tmp_path):
    check_family(api_client, custom, hostile_ns, inproc_ns, hostile_operator, "constraints", 80, 12, tmp_path)


def test_hostile_parameter_definitions_are_rejected_naming_the_parameter(
        api_client, custom, hostile_ns, inproc_ns, hostile_operator, tmp_path):
    check_family(api_client, custom, hostile_ns, inproc_ns, hostile_operator, "parameters", 60, 10, tmp_path)


def test_hostile_default_configs_are_rejected_naming_the_field(
        api_client, custom, hostile_ns, inproc_ns, hostile_operator, tmp_path):
    check_family(api_client, custom, hostile_ns, inproc_ns, hostile_operator, "default", 30, 6, tmp_path)


def test_unknown_target_devices_are_rejected_naming_the_target(
        api_client, custom, hostile_ns, inproc_ns, hostile_operator, tmp_path):
    check_family(api_client, custom, hostile_ns, inproc_ns, hostile_operator, "device", 12, 3, tmp_path)


def test_hostile_strategy_options_are_rejected_naming_the_option(
        api_client, custom, hostile_ns, inproc_ns, hostile_operator, tmp_path):
    check_family(api_client, custom, hostile_ns, inproc_ns, hostile_operator, "options", 40, 6, tmp_path)


def test_non_finite_range_is_a_spec_error(api_client, custom, hostile_ns, inproc_ns, hostile_operator):
    doc = base_doc()
    doc["spec"]["kernel"].pop("defaultConfig")
    doc["spec"]["parameters"].append({"name": "r", "type": "real", "range": {"min": 0, "max": 1e300, "step": 1e-300}})
    field = f"spec.parameters[{len(doc['spec']['parameters']) - 1}]"
    assert dry_run(custom, hostile_ns, doc)[0] == 201
    failures = []
    try:
        if (wrong := verdict(step_once(api_client, custom, inproc_ns, "range", doc), field)) is not None:
            failures.append(wrong)
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    problems, names = create_and_check(custom, hostile_ns, "range", [(doc, field)])
    report = report_of(hostile_operator, "range", failures, 1, problems, names)
    assert not report, "\n".join(report)
