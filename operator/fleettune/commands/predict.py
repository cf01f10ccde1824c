"""`fleettune predict`: recommend a configuration for a problem size that was never tuned,
from the stored results of a TuningRun (or, offline, Kernel Tuner caches of tuned sizes);
with ``--gpu NAME``, for a GPU type never tuned, from the other GPUs' results at the size.

The models are `fleettune.prediction`'s (also used by the operator for `spec.predictFor`)
and, for ``--gpu``, `fleettune.fleetprediction`'s (the operator's `status.predictions`
entries with source ``gpus``); this module reads the results and prints the recommendation.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleettune import fleetprediction, prediction
from fleettune.prediction import Observations, Records, observations, recommend
from fleettune.sizes import ProblemSize, parse_size, problem_size, size_key, target_of_key

if TYPE_CHECKING:
    from fleettune.results import TrialRecord

Fleet = dict[str, dict[ProblemSize, Observations]]  # GPU → size → its observations


def _read_caches(paths: Sequence[str], *, one_kernel: bool) -> tuple[Any, list[tuple[str, ProblemSize, Observations]]]:
    """The first cache's space, and (GPU, size, observations) of each cache; the GPU is its
    ``device_name`` or, where that is empty (some AMD recordings), what the file is named
    after (``dedispersion_milo-MI250X.json.gz`` → ``MI250X``)."""
    from fleettune.space.kernel_tuner import read_kernel_tuner_cache

    space: Any = None
    kernel: str | None = None
    out: list[tuple[str, ProblemSize, Observations]] = []
    for path in paths:
        rec = read_kernel_tuner_cache(path)
        if rec.problem_size is None:
            raise ValueError(f"{path}: the cache records no problem_size")
        if space is None:
            space, kernel = rec.space, rec.kernel_name
        elif [p.name for p in rec.space.parameters] != [p.name for p in space.parameters]:
            raise ValueError(f"{path}: records other parameters than {paths[0]}")
        elif one_kernel and rec.kernel_name and kernel and rec.kernel_name != kernel:
            raise ValueError(f"{path}: kernel {rec.kernel_name!r}, not {kernel!r} as in {paths[0]}: "
                             "give caches of one kernel")
        gpu = rec.device_name or Path(path).name.removesuffix(".gz").removesuffix(".json").split("-", 1)[-1]
        obs = [(r.config, r.time_ms if r.failure is None else None) for r in rec.records]
        out.append((gpu, problem_size(rec.problem_size), obs))
    return space, out


def _cache_records(paths: Sequence[str]) -> tuple[Any, dict[ProblemSize, Observations]]:
    space, caches = _read_caches(paths, one_kernel=False)
    by_size: dict[ProblemSize, Observations] = {}
    for _, size, obs in caches:
        by_size.setdefault(size, []).extend(obs)
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


def _device_space(spec: dict[str, Any], device_name: str | None) -> Any:
    from fleettune.space import SearchSpace, lookup_device
    from fleettune.space.errors import SpaceError

    try:
        device = lookup_device(device_name) if device_name else None
    except SpaceError:
        device = None
    return SearchSpace.from_spec(spec["parameters"], spec.get("constraints") or [], device)


def _run_records(args: argparse.Namespace) -> tuple[Any, Records, str, str]:
    """Records of one pool of a TuningRun from the cluster, read as `fleettune report` reads
    them (`store.read_run`); returns (space, records by size, pool, namespace)."""
    from fleettune import store

    obj, records, namespace = store.read_run(args.run, args.namespace, args.kubeconfig, args.context)
    spec, status = obj["spec"], obj.get("status") or {}
    pools = [t["name"] for t in spec["targets"]]
    pool = args.target or pools[0]
    if pool not in pools:
        raise ValueError(f"run {args.run} has no target {pool!r} (targets: {', '.join(pools)})")
    space = _device_space(spec, _devices(status).get(pool))
    default_size = spec["kernel"].get("problemSize") or []
    by_size: dict[ProblemSize, list[TrialRecord]] = {}
    for r in records:
        if target_of_key(r.target) == pool:
            # Records of runs that tune several sizes carry theirs; the others the kernel's.
            by_size.setdefault(problem_size(r.problem_size or default_size), []).append(r)
    return space, {size: observations(recs) for size, recs in by_size.items()}, pool, namespace


def _devices(status: dict[str, Any]) -> dict[str, str]:
    """Each target's GPU product, as the run's status names it."""
    return {t.get("target") or t.get("name"): t["device"] for t in status.get("targets", []) if t.get("device")}


def _run_fleet(args: argparse.Namespace) -> tuple[Any, Fleet, dict[str, list[str]], Callable[..., bool] | None, str]:
    """Every pool's records of a TuningRun at its current round (as the operator predicts
    from), by target and size; returns (the space on ``--gpu``'s device, the fleet, each
    target's names — its own and its GPU product —, whether a configuration is valid on
    ``--gpu``, the source)."""
    from fleettune import store

    obj, records, namespace = store.read_run(args.run, args.namespace, args.kubeconfig, args.context)
    spec, status = obj["spec"], obj.get("status") or {}
    devices = _devices(status)
    default_size = spec["kernel"].get("problemSize") or []
    latest: dict[str, int] = {}
    for r in records:
        latest[r.target] = max(latest.get(r.target, r.round), r.round)
    by: dict[str, dict[ProblemSize, list[TrialRecord]]] = {}
    for r in records:
        if r.round == latest[r.target]:
            size = problem_size(r.problem_size or default_size)
            by.setdefault(target_of_key(r.target), {}).setdefault(size, []).append(r)
    fleet = {t: {s: observations(recs) for s, recs in sizes.items()} for t, sizes in by.items()}
    aliases = {t: [t, *([devices[t]] if t in devices else [])] for t in fleet}
    space, allowed = _gpu_space(spec, args.gpu)
    return space, fleet, aliases, allowed, f"run {namespace}/{args.run}"


def _gpu_space(spec: dict[str, Any], gpu: str) -> tuple[Any, Callable[..., bool] | None]:
    """The run's space on ``gpu``'s device and whether a configuration is valid there (its
    device's constraints, which the operator checks too); where the device catalogue does
    not know ``gpu``, the space without constraints and no check."""
    from fleettune.space import SearchSpace, lookup_device
    from fleettune.space.errors import SpaceError

    try:
        space = SearchSpace.from_spec(spec["parameters"], spec.get("constraints") or [], lookup_device(gpu))
    except SpaceError:
        return SearchSpace.from_spec(spec["parameters"], []), None

    def fits(config: dict[str, Any]) -> bool:
        try:
            return bool(space.is_valid(space.to_rows([config]))[0])
        except (SpaceError, KeyError, ValueError, TypeError):
            return False

    return space, fits


def same_gpu(name: str, gpu: str) -> bool:
    """Whether ``name``, as a person types it (H100, NVIDIA-H100-80GB-HBM3, a pool's name),
    names ``gpu``: the same product where the device catalogue knows both, else one's words
    among the other's (W6600 in AMD Radeon PRO W6600)."""
    from fleettune.space import lookup_device
    from fleettune.space.devices import normalise_product
    from fleettune.space.errors import SpaceError

    a, b = normalise_product(name).split(), normalise_product(gpu).split()
    if not a or not b or a == b:
        return bool(a) and a == b
    try:
        return lookup_device(name).name == lookup_device(gpu).name
    except SpaceError:
        pass
    short, long = sorted((a, b), key=len)
    return any(long[i:i + len(short)] == short for i in range(len(long) - len(short) + 1))


def predict_gpu(gpu: str, fleet: Fleet, aliases: dict[str, list[str]], size: ProblemSize | None,
                allowed: Callable[..., bool] | None = None) -> dict[str, Any]:
    """The operator's rule (`fleetprediction.recommend`) for ``gpu`` from the other GPUs of
    ``fleet`` at ``size`` (None: the one size the fleet holds); a GPU of the fleet with a valid
    result there gets its measured best. Raises ValueError with what is missing."""
    from fleettune.fleetprediction import MIN_CONFIDENCE, MIN_CONSENSUS, Table

    sizes = sorted({s for by_size in fleet.values() for s in by_size})
    if not sizes:
        raise ValueError("the data hold no results")
    if size is None:
        if len(sizes) > 1:
            raise ValueError(f"the data hold {len(sizes)} problem sizes ({', '.join(map(size_key, sizes))}): "
                             "choose one with --size")
        size = sizes[0]
    elif size not in sizes:
        raise ValueError(f"no GPU in the data measured problem size {size_key(size)} "
                         f"(measured: {', '.join(map(size_key, sizes))})")
    at = {g: by_size[size] for g, by_size in fleet.items() if size in by_size}
    mine = sorted(g for g in at if any(same_gpu(gpu, a) for a in aliases.get(g, [g])))
    own = [o for g in mine for o in at[g]]
    out: dict[str, Any] = {"gpu": gpu, "size": list(size), "measuredOn": mine, "ownResults": len(own)}
    table = Table.of(own)
    if table.times:
        best = table.ranked()[0]
        return out | {"prediction": "measured", "config": table.configs[best], "measuredMs": table.times[best],
                      "basis": f"measured: {', '.join(mine)} ran {len(table.times)} configuration(s) valid at "
                               "this size: its best, nothing predicted"}
    others = {g: o for g, o in at.items() if g not in mine}
    counts = {g: {"results": len(o), "valid": sum(ms is not None and 0 < ms < math.inf for _, ms in o)}
              for g, o in sorted(others.items())}
    if not any(c["valid"] for c in counts.values()):
        raise ValueError(f"no other GPU has a valid result at problem size {size_key(size)}: the rule needs one "
                         f"({MIN_CONSENSUS} for a consensus, {MIN_CONFIDENCE} for a confidence)")
    rec = fleetprediction.recommend(own, others, allowed)
    if rec is None:
        raise ValueError(f"every configuration the other GPUs ran failed on {gpu} or is invalid on it")
    entry = rec.as_dict()
    return out | {"prediction": entry.pop("source"), "otherGpus": counts, **entry}


def _gpu_main(args: argparse.Namespace) -> int:
    from fleettune import store

    try:
        size = parse_size(args.size) if args.size else None
        if args.cache:
            space, caches = _read_caches(args.cache, one_kernel=True)
            fleet: Fleet = {}
            for gpu, at, obs in caches:
                fleet.setdefault(gpu, {}).setdefault(at, []).extend(obs)
            aliases, allowed, source = {g: [g] for g in fleet}, None, f"{len(args.cache)} cache file(s)"
        else:
            space, fleet, aliases, allowed, source = _run_fleet(args)
        out = {"source": source, **predict_gpu(args.gpu, fleet, aliases, size, allowed)}
    except store.ReadError as exc:
        print(f"fleettune predict: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"fleettune predict: {exc}", file=sys.stderr)
        return 2
    if args.check:
        out["check"] = check_against(space, out["config"], args.check)
    if args.json:
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    where = f"GPU {args.gpu} at problem size {size_key(out['size'])} ({source})"
    if out["prediction"] == "measured":
        print(f"{where}: in the data as {', '.join(out['measuredOn'])}, so its measured best (nothing predicted)")
        print(f"  configuration: {json.dumps(out['config'], sort_keys=True)}")
        print(f"  measured time: {out['measuredMs']:.4g} ms")
    else:
        held = f"in the data as {', '.join(out['measuredOn'])} with no valid result" if out["measuredOn"] \
            else "not in the data"
        print(f"{where}: {held}, so predicted from the other GPUs")
        print(f"  configuration: {json.dumps(out['config'], sort_keys=True)}")
        if "expectedFraction" in out:
            low, high = out["expectedFractionRange"]
            print(f"  expected fraction of optimum: {out['expectedFraction']:.2f} ({low:.2f}..{high:.2f})")
        else:
            why = next((m for m in (fleetprediction.NO_CONFIDENCE, fleetprediction.NOT_MEASURED) if m in out["basis"]),
                       "no confidence")
            print(f"  expected fraction of optimum: unknown ({why})")
        print("  other GPUs: " + ", ".join(f"{g} ({c['results']} results, {c['valid']} valid)"
                                          for g, c in out["otherGpus"].items()))
        print(f"  basis: {out['basis']}")
    _print_check(out, args.check)
    return 0


def _print_check(out: dict[str, Any], check: str | None) -> None:
    if not check:
        return
    c = out["check"]
    if c["measuredMs"] is None:
        print(f"  check ({Path(check).name}): configuration not measured or failed there")
    else:
        print(f"  check ({Path(check).name}): measured {c['measuredMs']:.4g} ms, recorded optimum "
              f"{c['optimumMs']:.4g} ms, fraction of optimum {c['fractionOfOptimum']:.3f}")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fleettune predict", formatter_class=argparse.RawDescriptionHelpFormatter,
                                description=f"{__doc__}\n{prediction.__doc__}\n--gpu: {fleetprediction.__doc__}")
    p.add_argument("run", nargs="?", help="TuningRun whose stored results to use")
    p.add_argument("-n", "--namespace", help="default: the kubeconfig context's namespace")
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
    p.add_argument("--context")
    p.add_argument("--target", help="pool (default: the run's first target)")
    p.add_argument("--cache", action="append", default=[],
                   help="offline: a Kernel Tuner cache of one tuned size (repeatable); with --gpu, of one GPU each "
                        "(its device_name, or what the file is named after: kernel-MI250X.json.gz)")
    p.add_argument("--size", help="problem size to recommend for, e.g. 2048,2048 (with --gpu, optional when "
                                  "the data hold one size)")
    p.add_argument("--gpu", metavar="NAME",
                   help="recommend for a GPU type the data do not hold (H100, NVIDIA-H100-80GB-HBM3) from the "
                        "other GPUs' results at the size (a run: every target, its current round): the operator's "
                        "rule for status.predictions (source gpus), with the expected fraction of optimum when "
                        "three or more GPUs ran it. A GPU the data hold (A100 names NVIDIA A100-PCIE-40GB) is not "
                        "predicted: its measured best is printed, and said so (exit status 0)")
    p.add_argument("--check", help="a recording at --size (with --gpu, of that GPU): measure the recommendation "
                                   "against its optimum")
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    if bool(args.run) == bool(args.cache):
        p.error("give a run name, or --cache FILE (repeatable) for offline use")
    if not args.size and not args.gpu:
        p.error("--size is required (without --gpu)")
    if args.gpu is not None and not args.gpu.strip():
        p.error("--gpu: give a GPU name")
    if args.gpu and args.target:
        p.error("--gpu predicts for a GPU from every target of the run: leave out --target")
    return args


def main(argv: list[str]) -> int:
    from fleettune import store

    args = parse_args(argv)
    if args.gpu:
        return _gpu_main(args)
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
    _print_check(out, args.check)
    return 0
