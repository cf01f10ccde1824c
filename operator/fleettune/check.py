"""`fleettune check -f FILE [-f FILE ...]`: the checks the operator runs on a TuningRun before
it starts any Job, offline, for pipelines that validate manifests before they merge (no
cluster, no GPU).

It reads every TuningRun in the files, and the ConfigMaps they name from the same files,
and runs on each what the operator runs (the same functions): the spec against its schema,
the kernel (a built-in's name; a user kernel's expressions for each problem size), the node
selectors, the trial policy (the chart's defaults; the operator's environment variables,
``FLEETTUNE_ALLOWED_IMAGES`` and the others the chart sets, check against another), the
strategy's options, each target's search space on its GPU (constraints with the device's
limits, the default configuration in it), the `spec.warmStart` files, and a CUDA source
compiled with NVRTC (a Triton source: read without running it, and compiled with Triton's
compiler) for each target's GPU architecture. A target's GPU is its `device`, else
the product label of its node selector (``nvidia.com/gpu.product``, or
``fleettune.dev/gpu.product`` on Jetson nodes). A target with neither (nodes selected by a
pool label) is known only to the operator, from its nodes: its search space and its compile
are not checked, and a note says so.

Every problem is printed with its file, the run and the field's path. Exit status: 0 when
every run passes (notes included), 1 when one has a problem, 2 when a file cannot be read or
holds no TuningRun.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fleettune import GROUP
from fleettune.admission import OperatorConfigError, TrialPolicy
from fleettune.api import TargetSpec, TuningRunSpec
from fleettune.fingerprint.node import FT_PRODUCT, GFD_PRODUCT


@dataclass(frozen=True)
class Manifest:
    """A TuningRun or ConfigMap of a file: where it came from, and its body."""

    path: str
    kind: str
    namespace: str
    name: str
    body: Mapping[str, Any]


def read_manifests(paths: Sequence[str]) -> list[Manifest]:
    """Every TuningRun and ConfigMap of the files (``-``: standard input), in order; raises
    OSError or yaml.YAMLError for a file that cannot be read."""
    out = []
    for path in paths:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, Mapping):
                continue
            kind, api = doc.get("kind"), str(doc.get("apiVersion", ""))
            if (kind == "TuningRun" and api.startswith(f"{GROUP}/")) or (kind == "ConfigMap" and api == "v1"):
                meta = doc.get("metadata") or {}
                out.append(Manifest(path, kind, str(meta.get("namespace") or "default"), str(meta.get("name", "")),
                                    doc))
    return out


@dataclass(frozen=True)
class Finding:
    message: str
    problem: bool = True  # False: a note (what could not be checked offline)


def problems(run: Manifest, config_maps: Mapping[tuple[str, str], Mapping[str, str]],
             policy: TrialPolicy) -> Iterator[Finding]:
    """What the operator would refuse in ``run`` before any Job, each naming the field;
    ``config_maps``: the data of the files' ConfigMaps by (namespace, name)."""
    from fleettune.controller.priors import WarmStartMissing, read_sources
    from fleettune.controller.spec import SpecError, check_options, checked_spec
    from fleettune.kernelcheck import KernelSpecError, check_source_data, check_triton_source

    try:
        spec = checked_spec(run.body.get("spec") or {}, policy)
        check_options(spec)
    except SpecError as exc:
        yield Finding(str(exc))
        return
    if spec.warm_start:
        data = [config_maps.get((run.namespace, w.config_map)) for w in spec.warm_start]
        try:
            read_sources(spec.warm_start, data)
        except (WarmStartMissing, ValueError) as exc:
            yield Finding(f"{exc} (in the given files)" if isinstance(exc, WarmStartMissing) else str(exc))
    source: str | None = None
    if spec.kernel.user is not None:
        try:
            source = check_source_data(spec, config_maps.get((run.namespace, spec.kernel.user.config_map)))
        except KernelSpecError as exc:
            yield Finding(str(exc).replace("in the run's namespace",
                                           f"in namespace {run.namespace!r} of the given files"))
    if source is not None and spec.kernel.triton is not None:
        try:
            check_triton_source(spec, source)
        except KernelSpecError as exc:
            yield Finding(str(exc))
            source = None  # nothing to compile
    for i in range(len(spec.targets)):
        yield from _target_problems(spec, i, source)


def gpu_of(target: TargetSpec) -> str | None:
    """The target's GPU as the operator first knows it: its `device`, else the product label
    its node selector asks for."""
    selector = target.node_selector or {}
    return target.device or selector.get(GFD_PRODUCT) or selector.get(FT_PRODUCT)


def _target_problems(spec: TuningRunSpec, i: int, source: str | None) -> Iterator[Finding]:
    from fleettune.controller.fleet import compute_capability
    from fleettune.controller.pool import Pool, build_search
    from fleettune.controller.spec import SpecError
    from fleettune.kernelcheck import compile_check

    target = spec.targets[i]
    product = gpu_of(target)
    if product is None:
        yield Finding(f"spec.targets[{i}]: the GPU of target {target.name} is known only from its nodes (give "
                      f"targets[{i}].device, or select by {GFD_PRODUCT}): its search space and compile are not "
                      "checked", problem=False)
        return
    pool = Pool(spec=target, seed=0, key=target.name)
    try:
        build_search(spec, pool, product, f"spec.targets[{i}]")
    except SpecError as exc:
        yield Finding(f"{exc} (target {target.name})")
        return
    if source is None:
        return
    cc = compute_capability(pool)  # None for a GPU the catalog does not know: compiled as the operator would
    for size in spec.kernel.sizes():
        problem = compile_check(spec, source, cc, size)
        if problem is not None:
            yield Finding(f"{problem} (target {target.name}, compute capability {cc or 'unknown'})")
            return  # the same source fails the other sizes alike


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="fleettune check",
        description="Run the operator's checks of a TuningRun before any Job, offline: schema, expressions, "
        "constraints on each target's GPU, warm-start files, and CUDA or Triton source compiled for each "
        "target's architecture. No cluster, no GPU.",
    )
    parser.add_argument("-f", "--filename", action="append", required=True, metavar="FILE",
                        help="YAML file of TuningRuns and the ConfigMaps they name (repeatable; -: standard input)")
    args = parser.parse_args(argv)
    try:
        manifests = read_manifests(args.filename)
    except (OSError, yaml.YAMLError) as exc:
        print(f"fleettune check: {exc}", file=sys.stderr)
        return 2
    try:
        policy = TrialPolicy.from_env()
    except OperatorConfigError as exc:
        print(f"fleettune check: the trial policy in the environment: {exc}", file=sys.stderr)
        return 2
    runs = [m for m in manifests if m.kind == "TuningRun"]
    if not runs:
        print(f"fleettune check: no TuningRun ({GROUP}) in {', '.join(args.filename)}", file=sys.stderr)
        return 2
    config_maps = {(m.namespace, m.name): {str(k): str(v) for k, v in (m.body.get("data") or {}).items()}
                   for m in manifests if m.kind == "ConfigMap"}
    failed = 0
    for run in runs:
        found = list(problems(run, config_maps, policy))
        where = f"{run.path}: TuningRun {run.namespace}/{run.name}"
        for f in found:
            print(f"{where}: {f.message}" if f.problem else f"{where}: note: {f.message}")
        bad = any(f.problem for f in found)
        if not bad:
            print(f"{where}: ok")
        failed += bad
    if failed:
        print(f"{failed} of {len(runs)} TuningRun(s) would be refused", file=sys.stderr)
    return 1 if failed else 0
