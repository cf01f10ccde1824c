"""`fleettune predict`: recommend a configuration for a problem size that was never tuned,
from the stored results of a TuningRun (or, offline, Kernel Tuner caches of tuned sizes).

The model is `fleettune.prediction`'s (also used by the operator for `spec.predictFor`);
this module reads the results and prints its recommendation.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleettune import prediction
from fleettune.prediction import Observations, Records, observations, recommend
from fleettune.sizes import ProblemSize, parse_size, problem_size, size_key, target_of_key

if TYPE_CHECKING:
    from fleettune.results import TrialRecord


def _cache_records(paths: Sequence[str]) -> tuple[Any, dict[ProblemSize, Observations]]:
    from fleettune.space.kernel_tuner import read_kernel_tuner_cache

    space: Any = None
    by_size: dict[ProblemSize, Observations] = {}
    for path in paths:
        rec = read_kernel_tuner_cache(path)
        if rec.problem_size is None:
            raise ValueError(f"{path}: the cache records no problem_size")
        size = problem_size(rec.problem_size)
        if space is None:
            space = rec.space
        elif [p.name for p in rec.space.parameters] != [p.name for p in space.parameters]:
            raise ValueError(f"{path}: records other parameters than {paths[0]}")
        by_size.setdefault(size, []).extend((r.config, r.time_ms if r.failure is None else None) for r in rec.records)
    return space, by_size


def check_against(space: Any, config: dict[str, Any], path: str) -> dict[str, Any]:
    """How the recommendation did on a recording of the predicted size."""
    from fleettune.space.kernel_tuner import read_kernel_tuner_cache

    rec = read_kernel_tuner_cache(path)
    key = space.key(config)
    measured = next((r for r in rec.records if space.key(r.config) == key), None)
    best = rec.best()
    out: dict[str, Any] = {"recording": path, "optimumMs": best.time_ms if best else None}
    if measured is None or measured.time_ms is None or best is None or best.time_ms is None:
        out["measuredMs"] = None
        out["fractionOfOptimum"] = 0.0 if measured is not None else None
    else:
        out["measuredMs"] = measured.time_ms
        out["fractionOfOptimum"] = round(best.time_ms / measured.time_ms, 4)
    return out


def _run_records(args: argparse.Namespace) -> tuple[Any, Records, str, str]:
    """Records of one pool of a TuningRun from the cluster, read as `fleettune report` reads
    them (`store.read_run`); returns (space, records by size, pool, namespace)."""
    from fleettune import store
    from fleettune.space import SearchSpace, lookup_device
    from fleettune.space.errors import SpaceError

    obj, records, namespace = store.read_run(args.run, args.namespace, args.kubeconfig, args.context)
    spec, status = obj["spec"], obj.get("status") or {}
    pools = [t["name"] for t in spec["targets"]]
    pool = args.target or pools[0]
    if pool not in pools:
        raise ValueError(f"run {args.run} has no target {pool!r} (targets: {', '.join(pools)})")
    device_name = next((t.get("device") for t in status.get("targets", [])
                        if (t.get("target") or t.get("name")) == pool and t.get("device")), None)
    try:
        device = lookup_device(device_name) if device_name else None
    except SpaceError:
        device = None
    space = SearchSpace.from_spec(spec["parameters"], spec.get("constraints") or [], device)
    default_size = spec["kernel"].get("problemSize") or []
    by_size: dict[ProblemSize, list[TrialRecord]] = {}
    for r in records:
        if target_of_key(r.target) == pool:
            # Records of runs that tune several sizes carry theirs; the others the kernel's.
            by_size.setdefault(problem_size(r.problem_size or default_size), []).append(r)
    return space, {size: observations(recs) for size, recs in by_size.items()}, pool, namespace


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune predict", description=f"{__doc__}\n{prediction.__doc__}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", help="TuningRun whose stored results to use")
    p.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context")
    p.add_argument("--target", help="pool (default: the run's first target)")
    p.add_argument("--cache", action="append", default=[],
                   help="offline: a Kernel Tuner cache of one tuned size (repeatable)")
    p.add_argument("--size", required=True, help="problem size to recommend for, e.g. 2048,2048")
    p.add_argument("--check", help="a recording at --size: measure the recommendation against its optimum")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    if bool(args.run) == bool(args.cache):
        p.error("give a run name, or --cache FILE (repeatable) for offline use")
    return args


def main(argv: list[str]) -> int:
    from fleettune import store

    args = parse_args(argv)
    by_size: Records
    try:
        size = parse_size(args.size)
        if args.cache:
            space, by_size = _cache_records(args.cache)
            source = f"{len(args.cache)} cache file(s)"
        else:
            space, by_size, pool, namespace = _run_records(args)
            source = f"run {namespace}/{args.run}, pool {pool}"
        rec = recommend(space, by_size, size)
    except store.ReadError as exc:
        print(f"fleettune predict: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"fleettune predict: {exc}", file=sys.stderr)
        return 2
    out = {"size": list(size), "source": source, **rec.as_dict()}
    if args.check:
        out["check"] = check_against(space, rec.config, args.check)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"problem size {size_key(size)} ({source})")
    print(f"  configuration: {json.dumps(rec.config, sort_keys=True)}")
    print(f"  predicted time: {rec.predicted_ms:.4g} ms")
    print(f"  basis: {rec.basis}")
    if args.check:
        c = out["check"]
        if c["measuredMs"] is None:
            print(f"  check ({Path(args.check).name}): configuration not measured or failed there")
        else:
            print(f"  check ({Path(args.check).name}): measured {c['measuredMs']:.4g} ms, recorded optimum "
                  f"{c['optimumMs']:.4g} ms, fraction of optimum {c['fractionOfOptimum']:.3f}")
    return 0
