"""`fleettune bench triton`: how fast this machine's CPUs compile a Triton kernel's
configurations, against the GPU time a batch spends measuring them.

A batch Pod compiles its next configurations on the node's CPUs while the GPU measures the
current one. For CUDA source NVRTC takes a fraction of a second per configuration; Triton's
compiler (its Python front end, MLIR passes, LLVM, ptxas) takes longer, so compiling can
bound a batch instead of the GPU. This command takes a TuningRun with ``kernel.triton`` and
its ConfigMap from a file, draws configurations from the run's search space (seeded), and
compiles them for a compute capability with ``--workers`` processes at once, each compiling
its share in turn, as the job's compile-ahead workers would (wall time includes each
process's start and Triton's import, about 0.7 s, once):

* **cold**: a fresh Triton cache (a configuration the fleet never compiled);
* **cached**: the same configurations again with that cache (a node that compiled them
  before, e.g. a retried batch).

It prints configurations per second, the median and 90th percentile of one compile, and
how many GPU-seconds per configuration a batch must spend measuring for the GPU, not the
compile, to bound it (``--gpu-ms``: one launch's time, times ``warmups + repeats``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def _load(path: str) -> tuple[Any, str]:
    from fleettune.api import TuningRunSpec
    from fleettune.check import read_manifests

    manifests = read_manifests([path])
    run = next((m for m in manifests if m.kind == "TuningRun"), None)
    if run is None:
        raise SystemExit(f"fleettune bench triton: no TuningRun in {path}")
    spec = TuningRunSpec.model_validate(run.body["spec"])
    if spec.kernel.triton is None:
        raise SystemExit(f"fleettune bench triton: TuningRun {run.name} has no kernel.triton")
    maps = {m.name: m.body.get("data") or {} for m in manifests if m.kind == "ConfigMap"}
    data = maps.get(spec.kernel.triton.config_map, {})
    if spec.kernel.triton.key not in data:
        raise SystemExit(f"fleettune bench triton: ConfigMap {spec.kernel.triton.config_map} with key "
                         f"{spec.kernel.triton.key} is not in {path}")
    return spec, str(data[spec.kernel.triton.key])


def _compile_all(requests: list[Any], workers: int, cache: str) -> tuple[float, list[float], int]:
    """Wall seconds for all (``workers`` processes, each compiling its share in turn, as a
    long-lived compile-ahead worker would), each compile's seconds, and how many failed."""
    from fleettune_job.tritonsource import compile_many

    shares = [requests[i::workers] for i in range(workers) if requests[i::workers]]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        done = [r for results in pool.map(lambda share: compile_many(share, cache), shares) for r in results]
    return time.perf_counter() - start, [r.seconds for r in done], sum(r.error is not None for r in done)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fleettune bench triton", description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--filename", required=True,
                        help="YAML with a TuningRun (kernel.triton) and its ConfigMap")
    parser.add_argument("--cc", default="8.0", help="compute capability to compile for (default 8.0)")
    parser.add_argument("--configs", type=int, default=16, help="configurations drawn from the space (default 16)")
    parser.add_argument("--workers", type=int, default=2, help="compiles at once (default 2: the CI machine's cores)")
    parser.add_argument("--gpu-ms", type=float, default=1.0,
                        help="one launch's GPU time in ms, to compare with (default 1.0)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = parser.parse_args(argv)

    from fleettune.space import SearchSpace
    from fleettune_job import tritonsource

    spec, source = _load(args.filename)
    if not tritonsource.available():
        print("fleettune bench triton: Triton is not installed (the triton extra)", file=sys.stderr)
        return 2
    space = SearchSpace.from_spec([p.dump() for p in spec.parameters], list(spec.constraints))
    rows = space.sample(min(args.configs, space.count()), np.random.default_rng(args.seed))
    arguments = [(a.kind, a.dtype) for a in spec.kernel.triton.arguments]
    requests = [tritonsource.CompileRequest.of(source, spec.kernel.triton.function, arguments,
                                               (spec.kernel.default_config or {}) | config, args.cc)
                for config in space.to_configs(rows)]
    launches = spec.kernel.warmups + spec.kernel.repeats
    figures: dict[str, Any] = {"configs": len(requests), "workers": args.workers, "cc": args.cc,
                               "triton": tritonsource.version(), "launches_per_config": launches}
    with tempfile.TemporaryDirectory(prefix="fleettune-bench-triton-") as cache:
        for phase in ("cold", "cached"):
            wall, each, failed = _compile_all(requests, args.workers, cache)
            figures[phase] = {"wall_s": round(wall, 2), "configs_per_s": round(len(requests) / wall, 2),
                              "median_s": round(statistics.median(each), 2),
                              "p90_s": round(float(np.percentile(each, 90)), 2), "compile_errors": failed}
    print(f"Triton {figures['triton']}: {len(requests)} configurations of {spec.kernel.triton.function} for "
          f"sm_{args.cc.replace('.', '')}, {args.workers} compiles at once")
    print(f"{'':8} {'configs/s':>10} {'median s':>9} {'p90 s':>7} {'errors':>7}")
    for phase in ("cold", "cached"):
        f = figures[phase]
        print(f"{phase:8} {f['configs_per_s']:>10} {f['median_s']:>9} {f['p90_s']:>7} {f['compile_errors']:>7}")
    gpu_s = args.gpu_ms * launches / 1000
    bound = 1 / figures["cold"]["configs_per_s"]
    figures["gpu_s_per_config"] = round(gpu_s, 4)
    figures["bound"] = "compile" if bound > gpu_s else "gpu"
    print(f"GPU time per configuration at {args.gpu_ms} ms a launch ({launches} launches): {gpu_s:.3f} s; "
          f"cold compiles take {bound:.2f} s each: the {figures['bound']} bounds the batch")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0
