"""`fleettune bench space`: search-space build/count/enumerate/sample times vs python-constraint.

The cases (`CASES`: a real GEMM space, and two stencil spaces too large to enumerate
naively), the targets and how to read the table: docs/benchmarks.md.

Every measurement runs in its own subprocess so that its peak memory (max RSS, from
``wait4``) is its own. python-constraint (what Kernel Tuner uses) has no build/count/enumerate
split: its "build" is ``getSolutions()``; where that cannot finish within ``--budget``
seconds, it is timed through ``getSolutionIter()`` for the budget and the full enumeration
time is extrapolated from the rate (marked "~" in the table). It cannot sample without
enumerating, so its sampling time is the time to enumerate all valid configurations.
Benchmarks print tables; they are not timed tests.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def _p2(n: int) -> list[int]:
    return [2**i for i in range(n)]


@dataclass
class Case:
    name: str
    description: str
    parameters: list[dict[str, Any]]
    constraints: list[str]
    # The same constraints as python functions for python-constraint: (function, parameter names).
    baseline: list[tuple[Callable[..., bool], list[str]]] = field(default_factory=list)
    enumerate: bool = True
    sample: int = 10_000


def _gemm() -> Case:
    tune = {"MWG": [16, 32, 64, 128], "NWG": [16, 32, 64, 128], "KWG": [32], "MDIMC": [8, 16, 32],
            "NDIMC": [8, 16, 32], "MDIMA": [8, 16, 32], "NDIMB": [8, 16, 32], "KWI": [2], "VWM": [1, 2, 4, 8],
            "VWN": [1, 2, 4, 8], "STRM": [0], "STRN": [0], "SA": [0, 1], "SB": [0, 1], "PRECISION": [32]}
    return Case(
        "gemm", "CLBlast GEMM, 15 params, Kernel Tuner restrictions",
        [{"name": k, "type": "ordinal", "values": v} for k, v in tune.items()],
        ["KWG % KWI == 0", "MWG % (MDIMC * VWM) == 0", "NWG % (NDIMC * VWN) == 0", "MWG % (MDIMA * VWM) == 0",
         "NWG % (NDIMB * VWN) == 0", "KWG % ((MDIMC * NDIMC)/MDIMA) == 0", "KWG % ((MDIMC * NDIMC)/NDIMB) == 0"],
        [(lambda KWG, KWI: KWG % KWI == 0, ["KWG", "KWI"]),
         (lambda MWG, MDIMC, VWM: MWG % (MDIMC * VWM) == 0, ["MWG", "MDIMC", "VWM"]),
         (lambda NWG, NDIMC, VWN: NWG % (NDIMC * VWN) == 0, ["NWG", "NDIMC", "VWN"]),
         (lambda MWG, MDIMA, VWM: MWG % (MDIMA * VWM) == 0, ["MWG", "MDIMA", "VWM"]),
         (lambda NWG, NDIMB, VWN: NWG % (NDIMB * VWN) == 0, ["NWG", "NDIMB", "VWN"]),
         (lambda KWG, MDIMC, NDIMC, MDIMA: KWG % ((MDIMC * NDIMC) / MDIMA) == 0, ["KWG", "MDIMC", "NDIMC", "MDIMA"]),
         (lambda KWG, MDIMC, NDIMC, NDIMB: KWG % ((MDIMC * NDIMC) / NDIMB) == 0, ["KWG", "MDIMC", "NDIMC", "NDIMB"])],
    )


_STENCIL_PARAMS = [
    {"name": "bx", "type": "ordinal", "values": _p2(11)},
    {"name": "by", "type": "ordinal", "values": _p2(11)},
    {"name": "bz", "type": "ordinal", "values": _p2(7)},
    {"name": "tx", "type": "integer", "range": {"min": 1, "max": 8}},
    {"name": "ty", "type": "integer", "range": {"min": 1, "max": 8}},
    {"name": "tz", "type": "integer", "range": {"min": 1, "max": 12}},
    {"name": "ux", "type": "integer", "range": {"min": 1, "max": 8}},
    {"name": "vec", "type": "ordinal", "values": [1, 2, 4, 8]},
    {"name": "use_shmem", "type": "boolean"},
    {"name": "read_only", "type": "boolean"},
    {"name": "prefetch", "type": "integer", "range": {"min": 0, "max": 2}},
    {"name": "order", "type": "categorical", "values": ["xyz", "yxz", "zxy", "zyx"]},
]
_STENCIL_CONSTRAINTS = [
    "64 <= bx * by * bz <= device.max_threads_per_block",
    "tx % ux == 0",
    "not use_shmem or (bx * tx + 2) * (by * ty + 2) * (bz * tz) * 4 <= device.shared_memory_per_block",
    "(bx * tx) % vec == 0",
    "use_shmem or prefetch == 0",
]
_STENCIL_BASELINE: list[tuple[Callable[..., bool], list[str]]] = [
    (lambda bx, by, bz: 64 <= bx * by * bz <= 1024, ["bx", "by", "bz"]),
    (lambda tx, ux: tx % ux == 0, ["tx", "ux"]),
    (lambda use_shmem, bx, tx, by, ty, bz, tz: not use_shmem or (bx * tx + 2) * (by * ty + 2) * (bz * tz) * 4 <= 49152,
     ["use_shmem", "bx", "tx", "by", "ty", "bz", "tz"]),
    (lambda bx, tx, vec: (bx * tx) % vec == 0, ["bx", "tx", "vec"]),
    (lambda use_shmem, prefetch: use_shmem or prefetch == 0, ["use_shmem", "prefetch"]),
]


def _large() -> Case:
    return Case("large", "3-D stencil, 12 params, ~1e9 Cartesian", list(_STENCIL_PARAMS), list(_STENCIL_CONSTRAINTS),
                list(_STENCIL_BASELINE))


def _huge() -> Case:
    extra = [
        {"name": "uy", "type": "integer", "range": {"min": 1, "max": 8}},
        {"name": "uz", "type": "integer", "range": {"min": 1, "max": 4}},
        {"name": "vec_y", "type": "ordinal", "values": [1, 2, 4, 8]},
        {"name": "swizzle", "type": "ordinal", "values": [1, 2, 4, 8]},
        {"name": "cache", "type": "categorical", "values": ["none", "l1", "l2"]},
    ]
    cons = ["32 <= bx * by * bz <= device.max_threads_per_block", *_STENCIL_CONSTRAINTS[1:],
            "ty % uy == 0", "cache != 'l1' or read_only"]
    base = [(lambda bx, by, bz: 32 <= bx * by * bz <= 1024, ["bx", "by", "bz"]), *_STENCIL_BASELINE[1:],
            (lambda ty, uy: ty % uy == 0, ["ty", "uy"]),
            (lambda cache, read_only: cache != "l1" or read_only, ["cache", "read_only"])]
    return Case("huge", "stencil + 5 params, ~1e12 Cartesian", [*_STENCIL_PARAMS, *extra], cons, base,
                enumerate=False)


CASES: dict[str, Callable[[], Case]] = {"gemm": _gemm, "large": _large, "huge": _huge}
DEVICE = "NVIDIA-A100-SXM4-40GB"  # limits used by the device.* constraints (1024 threads, 48 KiB)


# ---------------------------------------------------------------------------------------------
# workers (one subprocess per measurement)


def _work_fleettune(case: Case) -> dict[str, Any]:
    import numpy as np

    from fleettune.space import SearchSpace, lookup_device

    out: dict[str, Any] = {}
    t = time.perf_counter()
    space = SearchSpace.from_spec(case.parameters, case.constraints, lookup_device(product=DEVICE))
    out["build"] = time.perf_counter() - t
    out["valid"] = space.count()
    out["count"] = time.perf_counter() - t  # build + exact count
    out["cartesian"] = space.cartesian_size
    if case.enumerate:
        t = time.perf_counter()
        rows = space.enumerate()
        out["enumerate"] = out["count"] + time.perf_counter() - t  # build + all valid index rows
        out["enumerated"] = int(rows.shape[0])
        del rows
    t = time.perf_counter()
    draws = space.sample(case.sample, np.random.default_rng(0))
    out["sample"] = time.perf_counter() - t
    out["sample_valid"] = bool(space.is_valid(draws).all())
    return out


def _work_constraint(case: Case, budget: float, valid: int | None) -> dict[str, Any]:
    import constraint

    out: dict[str, Any] = {}
    t = time.perf_counter()
    problem = constraint.Problem()
    for p in case.parameters:
        if p["type"] == "boolean":
            values: list[Any] = [False, True]
        elif "values" in p:
            values = list(p["values"])
        else:
            r = p["range"]
            values = list(range(r["min"], r["max"] + 1, r.get("step", 1)))
        problem.addVariable(p["name"], values)
    for fn, names in case.baseline:
        problem.addConstraint(constraint.FunctionConstraint(fn), names)
    setup = time.perf_counter() - t
    if valid:
        # What holding getSolutions() would cost: measure the list of dicts for a prefix.
        import itertools
        import tracemalloc

        tracemalloc.start()
        prefix = list(itertools.islice(problem.getSolutionIter(), 20_000))
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out["hold_all_mib"] = held / max(len(prefix), 1) * valid / 2**20
        del prefix
    found = 0
    t = time.perf_counter()
    finished = True
    for _ in problem.getSolutionIter():
        found += 1
        if (found & 1023) == 0 and time.perf_counter() - t > budget:
            finished = False
            break
    elapsed = time.perf_counter() - t
    if finished and found < 200_000:
        # Small enough to hold: time what Kernel Tuner does, getSolutions() (a list of dicts).
        t = time.perf_counter()
        found = len(problem.getSolutions())
        elapsed = time.perf_counter() - t
    out["found"] = found
    out["finished"] = finished
    out["enumerate"] = setup + elapsed
    if not finished and valid:
        out["enumerate"] = setup + elapsed * valid / max(found, 1)
        out["estimated"] = True
    out["build"] = out["count"] = out["sample"] = out["enumerate"]
    return out


def _worker(argv: list[str]) -> int:
    impl, name, budget, valid = argv[0], argv[1], float(argv[2]), int(argv[3]) if argv[3] != "-" else None
    case = CASES[name]()
    result = _work_fleettune(case) if impl == "fleettune" else _work_constraint(case, budget, valid)
    print(json.dumps(result))
    return 0


def _fmt_time(v: float | None, estimated: bool = False) -> str:
    if v is None:
        return "-"
    text = f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"
    return ("~" + text) if estimated else text


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--worker":
        import resource

        code = _worker(argv[1:])
        # Peak RSS of this worker alone (KiB on Linux), appended for the parent.
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(json.dumps({"peak_rss_mib": peak / 1024}))
        return code
    parser = argparse.ArgumentParser(prog="fleettune bench space", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated subset of " + ", ".join(CASES))
    parser.add_argument("--budget", type=float, default=20.0,
                        help="seconds python-constraint may enumerate per case before extrapolating (default 20)")
    parser.add_argument("--no-baseline", action="store_true", help="skip python-constraint")
    parser.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s): {', '.join(unknown)}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        ft = _run_worker_with_peak("fleettune", name, args.budget, None, timeout=600)
        pc: dict[str, Any] = {}
        if not args.no_baseline:
            pc = _run_worker_with_peak("constraint", name, args.budget, ft.get("valid"), timeout=args.budget * 3 + 120)
        results[name] = {"fleettune": ft, "python-constraint": pc}
    _print_table(results)
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


def _run_worker_with_peak(impl: str, case: str, budget: float, valid: int | None, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    source_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = source_root + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "fleettune_dev.bench.space", "--worker", impl, case, str(budget),
           str(valid) if valid is not None else "-"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or len(lines) < 2:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    result = json.loads(lines[-2])
    result.update(json.loads(lines[-1]))
    return result


def _print_table(results: dict[str, dict[str, Any]]) -> None:
    header = f"{'case':<7} {'metric':<10} {'fleettune':>12} {'python-constraint':>18} {'ratio':>9}"
    print(header)
    print("-" * len(header))
    for name, pair in results.items():
        ft, pc = pair["fleettune"], pair["python-constraint"]
        if "error" in ft:
            print(f"{name:<7} fleettune failed: {ft['error']}")
            continue
        case = CASES[name]()
        print(f"{name:<7} {'space':<10} {ft['cartesian']:>12.3g} cartesian, {ft['valid']} valid "
              f"({ft['valid'] / ft['cartesian']:.2%})")
        metrics = ["build", "count"] + (["enumerate"] if case.enumerate else []) + ["sample"]
        for metric in metrics:
            ours = ft.get(metric)
            theirs = pc.get(metric) if pc and "error" not in pc else None
            est = bool(pc.get("estimated"))
            label = {"count": "+count", "enumerate": "+enumerate", "sample": f"sample {case.sample // 1000}k"}.get(
            metric, metric)
            ratio = f"{theirs / ours:,.0f}x" if theirs and ours else "-"
            print(f"{'':<7} {label:<10} {_fmt_time(ours):>12} {_fmt_time(theirs, est):>18} "
                  f"{('~' if est else '') + ratio:>9}")
        ours_mem = ft.get("peak_rss_mib")
        theirs_mem = pc.get("peak_rss_mib") if pc and "error" not in pc else None
        note = " (partial run)" if pc.get("estimated") else ""
        print(f"{'':<7} {'peak RSS':<10} {ours_mem or 0:>9.0f} MiB {theirs_mem or 0:>14.0f} MiB{note}")
        if pc and "error" in pc:
            print(f"{'':<7} python-constraint: {pc['error']}")
        elif pc:
            print(f"{'':<7} python-constraint found {pc['found']} solutions"
                  f"{'' if pc['finished'] else ' before the budget ran out'}; holding all of them as "
                  f"getSolutions() does takes ~{pc.get('hold_all_mib', 0):,.0f} MiB")
    print("fleettune: build, build+count, build+enumerate (all valid rows), and sample from a built space.\n"
          "python-constraint: getSolutions() each time (it has no separate build, count or sampling); "
          "'~' = extrapolated from getSolutionIter() over --budget. Peak RSS includes the interpreter.")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
