"""Every built-in kernel is answered on every pool of the demo fleet: from the pool's
recording where there is one, else from the synthetic model of the kernel itself (marked
synthetic), which follows the kernel's and the GPU's rules and is deterministic by seed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from one_config import batch_env, only

from fleettune.api import TuningRunSpec
from fleettune.space import SearchSpace, lookup_device
from fleettune_dev.cluster.fleet import NodePool, default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.builtin import modelled_kernels
from fleettune_job.kernels import BUILTINS
from fleettune_job.protocol import TRIAL_ENV, Outcome, Trial, TrialResult

FLEET = default_fleet()
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _answer(pool: NodePool, kernel: str, config: dict[str, Any], problem_size: list[int] | None = None,
            seed: int = 0) -> TrialResult:
    desc = BUILTINS[kernel]
    trial = Trial.model_validate({
        "run": "r", "target": pool.name, "index": 0, "kernel": {"builtin": kernel}, "config": config,
        "problem_size": problem_size or list(desc.problem_size)})
    node = pool.node_names()[0]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"nodeName": node, "containers": [
               {"name": "trial", "image": "t", "env": [{"name": TRIAL_ENV, "value": batch_env(trial)}]}]}}
    answer = FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0, seed=seed).answer(
        pod, pool.node_labels(node))
    return only(answer).result


@pytest.mark.parametrize("pool", FLEET.pools, ids=FLEET.pool_names())
@pytest.mark.parametrize("kernel", sorted(BUILTINS))
def test_every_builtin_kernel_is_answered_on_every_demo_pool(pool: NodePool, kernel: str) -> None:
    result = _answer(pool, kernel, BUILTINS[kernel].default_config)
    assert result.outcome == Outcome.OK and result.objective and result.objective > 0, result.error
    # Synthetic exactly where nobody recorded the kernel on this GPU.
    assert result.fingerprint is not None
    assert result.fingerprint.synthetic == (kernel not in pool.simulation.recordings)
    assert (kernel in modelled_kernels(pool)) == (kernel not in pool.simulation.kernels())


def _pools_of(target: Any) -> list[NodePool]:
    """The demo pools whose nodes a target's node selector matches."""
    return [p for p in FLEET.pools
            if all(p.node_labels(p.node_names()[0]).get(k) == v for k, v in target.node_selector.items())]


RUNS = [(path.name, doc) for path in sorted(EXAMPLES.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())
        if doc and doc.get("kind") == "TuningRun" and doc["spec"]["kernel"].get("builtin")]


@pytest.mark.parametrize(("name", "doc"), RUNS, ids=[n for n, _ in RUNS])
def test_every_configuration_of_a_builtin_example_gets_a_verdict_not_an_infrastructure_failure(name, doc) -> None:
    spec = TuningRunSpec.model_validate(doc["spec"])
    assert spec.kernel.builtin is not None
    for target in spec.targets:
        (pool,) = _pools_of(target)
        space = SearchSpace.from_spec([p.dump() for p in spec.parameters], list(spec.constraints),
                                      lookup_device(pool.gpu.product))
        configs = [spec.kernel.default_config or {}, *space.to_configs(space.sample(12, np.random.default_rng(0)))]
        for size in spec.kernel.sizes():
            results = [_answer(pool, spec.kernel.builtin, c, list(size)) for c in configs]
            assert results[0].outcome == Outcome.OK, (name, pool.name, size, results[0].error)
            assert all(r.outcome != Outcome.INFRA_ERROR for r in results), (name, pool.name)
            assert sum(r.outcome == Outcome.OK for r in results) > len(results) // 2


def test_the_model_follows_the_kernels_and_the_gpus_rules() -> None:
    pool = FLEET.pool("jetson-orin")
    too_many_threads = _answer(pool, "gemm", {"block_size_x": 64, "block_size_y": 32})
    assert too_many_threads.outcome == Outcome.LAUNCH_ERROR and "2048 threads" in too_many_threads.error
    shared = _answer(pool, "gemm", {"block_size_x": 32, "block_size_y": 32, "tile_size_x": 8, "tile_size_y": 8,
                                    "tile_k": 32})
    assert shared.outcome == Outcome.COMPILE_ERROR and "48 KiB" in shared.error
    enforced = _answer(pool, "scan", {"items_per_thread": 2, "vector_width": 4})
    assert enforced.outcome == Outcome.COMPILE_ERROR and "items_per_thread % vector_width" in enforced.error
    whole_warps = _answer(pool, "scan", {"block_size_x": 48, "use_shuffle": 1})
    assert whole_warps.outcome == Outcome.COMPILE_ERROR
    unknown = _answer(pool, "scan", {"block_size_q": 1})
    assert unknown.outcome == Outcome.COMPILE_ERROR and "block_size_q" in unknown.error
    # A problem the kernel cannot take is the trial's fault, as in the job.
    assert _answer(pool, "gemm", {}, [64, 64]).outcome == Outcome.INFRA_ERROR
    assert all(r.fingerprint is not None and r.fingerprint.synthetic
               for r in (too_many_threads, shared, enforced, unknown))


def test_the_model_is_deterministic_by_seed_and_tells_configurations_and_gpus_apart() -> None:
    a100, orin = FLEET.pool("a100"), FLEET.pool("jetson-orin")
    default = BUILTINS["gemm"].default_config
    other = default | {"block_size_x": 32, "block_size_y": 8, "tile_size_x": 2}
    first = _answer(a100, "gemm", default, seed=1)
    assert _answer(a100, "gemm", default, seed=1) == first
    assert _answer(a100, "gemm", default, seed=2).objective != first.objective
    assert _answer(a100, "gemm", other, seed=1).objective != first.objective
    # Fewer SMs, slower: the Orin takes several times the A100's time.
    assert (_answer(orin, "gemm", default, seed=1).objective or 0) > 3 * (first.objective or 0)
    # A bigger problem takes longer.
    assert (_answer(a100, "gemm", default, [4096, 4096, 4096], seed=1).objective or 0) > 4 * (first.objective or 0)
