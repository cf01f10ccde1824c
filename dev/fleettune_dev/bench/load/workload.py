"""The load of `fleettune bench load`: the fleet (the demo fleet's pools, resized) and the
TuningRuns applied to it.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import yaml

from fleettune.labels import MANAGED_BY, MANAGER, POOL_LABEL

NAMESPACE = "bench"
MANAGED = f"{MANAGED_BY}={MANAGER}"
EXAMPLE = Path(__file__).resolve().parents[4] / "examples" / "convolution-fleet.yaml"  # from a checkout


def bench_fleet(gpus: int, pools: int, per_node: int) -> Any:
    """The demo fleet's pools (cycled), resized so the fleet has ``gpus`` GPUs in ``pools`` pools."""
    from fleettune_dev.cluster.fleet import Fleet, default_fleet

    demo = default_fleet()
    if gpus % (pools * per_node):
        raise SystemExit(f"--gpus {gpus} is not a multiple of pools × GPUs per node ({pools} × {per_node})")
    nodes = gpus // (pools * per_node)
    out = []
    for i in range(pools):
        src = demo.pools[i % len(demo.pools)]
        name = src.name if i < len(demo.pools) else f"{src.name}-{i}"
        out.append(src.model_copy(update={
            "name": name, "nodes": nodes, "gpu": src.gpu.model_copy(update={"per_node": per_node}),
            # Room for the trial Pods' CPU/memory requests next to every GPU.
            "resources": src.resources.model_copy(update={"cpu": str(max(16, per_node)), "memory": "256Gi"}),
        }))
    return Fleet(pools=out)


def example_run() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def run_manifests(fleet: Any, runs: int, trials: int, parallelism: int, strategy: str,
                  trials_per_pod: int = 1) -> list[dict[str, Any]]:
    base = example_run()
    by_pool = {t["name"]: t for t in base["spec"]["targets"]}
    pools = fleet.pool_names()
    per_target = math.ceil(trials / (runs * len(pools)))
    docs = []
    for i in range(runs):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"load-{i:02d}", "namespace": NAMESPACE}
        spec = doc["spec"]
        spec["strategy"] = {"name": strategy, "seed": i}
        spec["budget"] = {"trialsPerTarget": per_target, "parallelism": parallelism, "trialTimeoutSeconds": 600,
                          "maxInfraFailures": 100, "trialsPerPod": trials_per_pod}
        targets = []
        for pool in pools:
            stem = pool.rsplit("-", 1)[0] if pool not in by_pool else pool
            target = copy.deepcopy(by_pool[stem])
            target["name"] = pool
            # Select by the pool label: extra pools copy another pool's GPU labels.
            target["nodeSelector"] = {POOL_LABEL: pool}
            targets.append(target)
        spec["targets"] = targets
        docs.append(doc)
    return docs
