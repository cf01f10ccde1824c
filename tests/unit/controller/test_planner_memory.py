"""The fleet's memory: a run starts from what earlier runs of the same kernel measured
(`fleettune.controller.memory`), driven through the planner with the cluster played by
tests/unit/controller/fleet_double.py; the stores' reader is proven by the integration tests."""

from __future__ import annotations

import copy
from typing import Any

from fleet_double import A100, FakeFleet, iso
from test_planner import SPEC, timed

from fleettune.api import TuningRunSpec
from fleettune.controller import memory
from fleettune.controller.memory import FleetMemory, fleet_prior, kernel_id, peers_of
from fleettune.controller.pool import Pool, build_search, in_space
from fleettune.results import StoredRun, TrialRecord
from fleettune_job.protocol import Fingerprint, Outcome


def spec(**changes: Any) -> dict[str, Any]:
    return {**copy.deepcopy(SPEC), **changes}


def finished_run(body: dict[str, Any], name: str = "conv-a", uid: str = "uid-a") -> StoredRun:
    """A run tuned to its end on the fake fleet, as its store holds it."""
    f = FakeFleet(spec=body, measure=timed)
    assert f.run().phase == "Succeeded"
    return StoredRun("ns", name, uid, False, list(f.store.records))


def test_the_identity_is_the_kernel_and_its_interface_not_its_space_sizes_or_gpus() -> None:
    base = TuningRunSpec.model_validate(SPEC)
    key = kernel_id(base, None)
    assert key == kernel_id(TuningRunSpec.model_validate(copy.deepcopy(SPEC)), None)  # stable
    narrower = spec(parameters=[{**p, "values": p["values"][:1]} for p in SPEC["parameters"]],
                    constraints=[], kernel={**SPEC["kernel"], "problemSize": [1024, 1024]},
                    targets=[{"name": "rtx", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-3090"}}])
    assert kernel_id(TuningRunSpec.model_validate(narrower), None) == key
    other_kernel = spec(kernel={"builtin": "gemm", "problemSize": [64, 64]})
    renamed = spec(parameters=[{**SPEC["parameters"][0], "name": "bx"}, *SPEC["parameters"][1:]])
    for other in (other_kernel, renamed):
        assert kernel_id(TuningRunSpec.model_validate(other), None) != key


def test_every_record_carries_its_kernel_for_later_runs_to_find() -> None:
    run = finished_run(spec(budget={"trialsPerTarget": 6, "parallelism": 3}))
    assert run.records and {r.kernel for r in run.records} == {kernel_id(TuningRunSpec.model_validate(SPEC), None)}


def test_a_run_starts_from_an_earlier_run_of_its_kernel_and_says_so() -> None:
    earlier = finished_run(spec(budget={"trialsPerTarget": 12, "parallelism": 3}))
    unrelated = StoredRun("ns", "gemm-a", "uid-g", False,
                          [r.model_copy(update={"kernel": "another"}) for r in earlier.records])
    body = spec(strategy={"name": "bayes", "seed": 1}, budget={"trialsPerTarget": 4, "parallelism": 2})
    f = FakeFleet(spec=body, measure=timed, memory=[earlier, unrelated])
    f.step()
    t = f.target()
    valid = sum(r.is_observation for r in earlier.records)
    assert t["learnedFrom"] == [{"kind": "Run", "name": "conv-a", "results": valid}]
    assert f.planner.pools["a100"].study is not None and f.planner.pools["a100"].study.n_prior == valid
    said = [m for kind, reason, m in f.planner.events if reason == "WarmStart"]
    assert said == [f"a100: starts from {valid} results of the fleet in its space: run conv-a ({valid})"]
    assert f.run().phase == "Succeeded"
    assert 0 <= f.target()["priorWeight"] <= 1
    assert f.memory_reads == 1  # once per kernel: nothing re-reads it while no pool builds its search


def test_a_run_that_opts_out_reads_nothing() -> None:
    earlier = finished_run(spec(budget={"trialsPerTarget": 6, "parallelism": 3}))
    f = FakeFleet(spec=spec(fleetMemory={"enabled": False}), measure=timed, memory=[earlier])
    f.run()
    assert f.memory_reads == 0 and not f.target().get("learnedFrom")
    assert f.planner.pools["a100"].study is None or f.planner.pools["a100"].study.n_prior == 0


def test_a_store_that_cannot_be_read_is_said_once_as_a_warning() -> None:
    f = FakeFleet(spec=spec(), measure=timed, memory_problems=["namespace team-b: forbidden"])
    f.step()
    f.planner.memory.read_at = None  # read again: the same problem is not said twice
    f.step()
    warned = [(kind, m) for kind, reason, m in f.planner.events if reason == "FleetMemory"]
    assert warned == [("Warning", "namespace team-b: forbidden: pools start without those results")]


def test_the_memory_is_read_again_only_when_a_pool_builds_its_search_after_a_while() -> None:
    m = FleetMemory()
    assert m.due("k", 0.0, building=False)
    m.accept("k", [], [], 0.0)
    assert not m.due("k", memory.REFRESH_S + 1, building=False)
    assert not m.due("k", memory.REFRESH_S - 1, building=True)
    assert m.due("k", memory.REFRESH_S + 1, building=True)
    assert m.due("another kernel", 1.0, building=False)  # the source changed


def _pool() -> Pool:
    body = TuningRunSpec.model_validate(SPEC)
    pool = Pool(spec=body.targets[0], seed=0, key="a100")
    build_search(body, pool, "NVIDIA-A100-PCIE-40GB", "spec.targets[0]")
    return pool


def _records(target: str, gpu: str, recorded_at: float, n: int, best: float) -> list[TrialRecord]:
    base = {"block_size_y": 1, "tile_size_x": 1, "tile_size_y": 1, "read_only": 0, "use_padding": 0,
            "use_shmem": 1, "use_cmem": 1, "filter_height": 15, "filter_width": 15}
    fingerprint = Fingerprint(product=gpu, compute_capability="8.0")
    return [TrialRecord(target=target, index=i, config={**base, "block_size_x": [16, 32, 64, 128][i % 4],
                                                        "block_size_y": [1, 2, 4, 8][i // 4 % 4]},
                        key=str(i), outcome=Outcome.OK, objective=best * (1 + i), fingerprint=fingerprint,
                        recorded_at=iso(recorded_at + i), kernel="k") for i in range(n)]


def test_the_prior_takes_the_pools_own_gpu_first_then_the_newest_up_to_its_cap(monkeypatch) -> None:
    pool = _pool()
    assert pool.device == "NVIDIA-A100-PCIE-40GB"  # a node label's spelling; the driver's differs
    old_same_gpu = StoredRun("ns", "old", "u1", False, _records("a100", "NVIDIA A100-PCIE-40GB", 1000.0, 6, 2.0))
    new_other_gpu = StoredRun("ns", "new", "u2", False, _records("rtx", "NVIDIA GeForce RTX 3090", 9000.0, 6, 5.0))
    shared = StoredRun("team-b", "b", "u3", True, _records("rtx", "NVIDIA GeForce RTX 3090", 5000.0, 6, 1.0))
    runs = [new_other_gpu, shared, old_same_gpu]
    use = fleet_prior(pool, [], runs, "ns", in_space(pool.space))
    assert use.sources == [("Run", "new", 6), ("Run", "old", 6), ("Run", "team-b/b", 6)]
    assert sorted(v for _, _, v in use.observations if v is not None)[:3] == [1.0, 1.0, 1.0]  # each group's best
    monkeypatch.setattr(memory, "MAX_OBSERVATIONS", 12)
    use = fleet_prior(pool, [], runs, "ns", in_space(pool.space))
    assert use.sources == [("Run", "new", 6), ("Run", "old", 6)]  # its own GPU's, then the newest other
    # The run's other pools come first, whatever their GPU.
    peers = [("rtx", _records("rtx", "NVIDIA GeForce RTX 3090", 100.0, 6, 3.0))]
    use = fleet_prior(pool, peers, runs, "ns", in_space(pool.space))
    assert use.sources == [("Pool", "rtx", 6), ("Run", "old", 6)] and use.peer_records == 6
    monkeypatch.setattr(memory, "MAX_OBSERVATIONS", 3)
    assert fleet_prior(pool, [], runs, "ns", in_space(pool.space)).sources == [("Run", "old", 6)]  # one at least
    assert "and" not in use.summary("a100")


def test_earlier_runs_on_three_other_gpus_are_measured_first_by_their_consensus_after_the_pools_own_gpu() -> None:
    pool = _pool()
    # Three other GPUs: a and c fastest at the first configuration, b there 6 times slower;
    # the fourth runs within 1.3 of the best on all three.
    a = _records("rtx", "NVIDIA GeForce RTX 3090", 100.0, 6, 1.0)
    b = _records("w6600", "AMD Radeon PRO W6600", 100.0, 6, 1.0)
    c = _records("w7800", "AMD Radeon PRO W7800", 100.0, 6, 1.0)
    for rec, slow_down in zip(b, [6.0, 5.0, 1.2, 1.0, 4.0, 3.0], strict=True):
        rec.objective = slow_down
    a[3].objective = c[3].objective = 1.3
    runs = [StoredRun("ns", name, name, False, records) for name, records in (("a", a), ("b", b), ("c", c))]
    first = fleet_prior(pool, [], runs, "ns", in_space(pool.space)).first
    # mean log slow-down: the fourth (2 log 1.3 + 0) / 3 = 0.17 beats the first (0 + log 6 + 0) / 3.
    assert first[0] == a[3].config and {repr(x) for x in first} == {repr(r.config) for r in a}
    # An earlier run on the pool's own GPU: its best comes first.
    own = StoredRun("ns", "old", "u1", False, _records("a100", "NVIDIA A100-PCIE-40GB", 50.0, 6, 2.0))
    first = fleet_prior(pool, [], [*runs, own], "ns", in_space(pool.space)).first
    assert first[0] == own.records[0].config and first[1] == a[3].config
    # Two other GPUs, or pools of the run still tuning: the prior's fastest first, as for any warm start.
    assert fleet_prior(pool, [], [*runs[:2], own], "ns", in_space(pool.space)).first == []
    peers = [(name, records) for name, records in (("rtx", a), ("w6600", b), ("w7800", c))]
    assert fleet_prior(pool, peers, [], "ns", in_space(pool.space)).first == []


def test_the_event_names_a_bounded_number_of_sources() -> None:
    use = memory.FleetPrior([], [("Run", f"r-{i}", 1) for i in range(memory.MAX_NAMED + 3)], 0)
    assert use.summary("a100").endswith(f"run r-{memory.MAX_NAMED - 1} (1) and 3 more")


RTX = {**A100, "nvidia.com/gpu.product": "NVIDIA-RTX-A4000", "nvidia.com/gpu.compute.major": "8",
       "nvidia.com/gpu.compute.minor": "6"}


def two_pools(trials: int = 16, **changes: Any) -> FakeFleet:
    """An A100 pool and an RTX pool of one run, one trial Pod at a time each."""
    targets = [SPEC["targets"][0], {"name": "rtx", "nodeSelector": {"nvidia.com/gpu.product": RTX[
        "nvidia.com/gpu.product"]}}]
    body = spec(targets=targets, strategy={"name": "bayes", "seed": 2},
                budget={"trialsPerTarget": trials, "parallelism": 1}, **changes)
    return FakeFleet(spec=body, measure=timed, nodes={"gpu-0": dict(A100), "gpu-1": dict(RTX)})


def test_the_pools_of_a_run_learn_from_each_other_as_they_measure() -> None:
    f = two_pools()
    builds: dict[str, list[int]] = {"a100": [], "rtx": []}
    for _ in range(100):
        plan = f.step()
        for key, pool in f.planner.pools.items():
            if pool.study is not None and (not builds[key] or builds[key][-1] != pool.peer_records):
                builds[key].append(pool.peer_records)
        if plan.finished:
            break
        f.finish()
        f.advance(10)
    assert plan.finished
    for key, other in (("a100", "rtx"), ("rtx", "a100")):
        learned = {(s["kind"], s["name"]): s["results"] for s in f.target(key)["learnedFrom"]}
        # The other pool's results, refreshed as they arrived (its last ones may come after).
        assert learned[("Pool", other)] >= 8, learned
        assert builds[key][0] < builds[key][-1] and len(builds[key]) <= 12, builds
        assert all(b >= 1.25 * a or b >= a + 2 for a, b in zip(builds[key], builds[key][1:], strict=False))
        assert 0 <= f.target(key)["priorWeight"] <= 1


def test_a_targets_other_sizes_always_inform_a_pool_other_targets_only_with_the_fleets_memory() -> None:
    f = two_pools(fleetMemory={"enabled": False})
    f.run()
    assert not f.target("a100").get("learnedFrom") and not f.target("rtx").get("learnedFrom")
    a100, rtx = pools = list(f.planner.pools.values())
    assert [key for key, _ in peers_of(a100, pools, f.store.records, fleet=True)] == [rtx.key]
    assert peers_of(a100, pools, f.store.records, fleet=False) == []
    rtx.problem_size = (1024, 1024)  # another target's other size: never
    assert peers_of(a100, pools, f.store.records, fleet=True) == []
    rtx.spec = a100.spec  # the same target's other size (the same GPUs): always
    assert [key for key, _ in peers_of(a100, pools, f.store.records, fleet=False)] == [rtx.key]


def test_the_sizes_of_a_target_tune_side_by_side_sharing_its_pods_and_their_results() -> None:
    kernel = {k: v for k, v in SPEC["kernel"].items() if k != "problemSize"}
    big, small = "a100.4096x4096", "a100.2048x2048"
    for parallelism in (2, 1):
        f = FakeFleet(spec=spec(kernel={**kernel, "problemSizes": [[4096, 4096], [2048, 2048]]},
                                strategy={"name": "bayes", "seed": 3}, fleetMemory={"enabled": False},
                                budget={"trialsPerTarget": 10, "parallelism": parallelism}), measure=timed)
        most, counts = 0, []
        for _ in range(200):
            plan = f.step()
            most = max(most, len(f.running()))
            counts.append({key: len(f.records_of(key)) for key in (big, small)})
            if plan.finished:
                break
            f.finish()
            f.advance(10)
        assert plan.finished and f.target(big)["phase"] == f.target(small)["phase"] == "Succeeded"
        assert most == parallelism  # the target's Pods, shared: never one per size on top
        # Side by side: each size had results while the other was still short of its budget ...
        assert any(c[small] > 0 and c[big] < 10 for c in counts) and any(c[big] > 0 and c[small] < 10 for c in counts)
        # ... and each learned from the other's results as they arrived (no fleet memory needed).
        for key, other in ((big, small), (small, big)):
            learned = {(s["kind"], s["name"]): s["results"] for s in f.target(key)["learnedFrom"]}
            assert learned[("Pool", other)] >= 4, learned


def test_a_restarted_operator_rebuilds_each_pools_shared_prior_from_the_store() -> None:
    f = two_pools(trials=40)
    for _ in range(2):
        f.step()
        f.finish()
        f.advance(10)
    assert not any(pool.done for pool in f.planner.pools.values())
    before = {key: pool.learned_from for key, pool in f.planner.pools.items()}
    assert all(before.values())
    f.planner = f.new_planner()
    f.step()
    for key, pool in f.planner.pools.items():
        assert pool.study is not None and pool.study.n_prior >= before[key][0][2]
        assert [(k, n) for k, n, _ in pool.learned_from] == [(k, n) for k, n, _ in before[key]]
