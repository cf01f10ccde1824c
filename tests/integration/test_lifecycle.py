"""Fleet lifecycle on the real control plane: driver upgrades, re-tunes, publishing, live edits."""

from __future__ import annotations

import json

import pytest
from operator_support import (
    apply,
    example,
    get_run,
    jobs,
    stored_records,
    wait_for,
    wait_phase,
)

from fleettune.labels import TARGET_LABEL

pytestmark = pytest.mark.integration

DRIVER = "nvidia.com/cuda.driver-version.full"
NEW_DRIVER = "560.35.03"




@pytest.fixture
def a100_nodes(cluster):
    """The A100 pool's nodes and their driver label, restored after the test."""
    out = cluster.kubectl("get", "nodes", "-l", "fleettune.dev/pool=a100", "-o", "json")
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"][DRIVER] for n in json.loads(out.stdout)["items"]}
    yield nodes
    for name, driver in nodes.items():
        cluster.kubectl("label", "node", name, f"{DRIVER}={driver}", "--overwrite")


def _upgrade(cluster, nodes, driver=NEW_DRIVER):
    for name in nodes:
        cluster.kubectl("label", "node", name, f"{DRIVER}={driver}", "--overwrite")


def _a100_only(name, policy, budget=5, **spec):
    doc = example(name, trialsPerTarget=budget, parallelism=2)
    doc["spec"]["targets"] = [t for t in doc["spec"]["targets"] if t["name"] == "a100"]
    doc["spec"]["retunePolicy"] = policy
    doc["spec"].update(spec)
    return doc


def _target(run):
    return run["status"]["targets"][0]


def _condition(run, kind):
    return next(c for c in run["status"]["conditions"] if c["type"] == kind)


def _published(cluster, namespace, name):
    out = cluster.kubectl("get", "configmap", "-n", namespace, name, "-o", "json")
    return json.loads(out.stdout)["data"]


def test_driver_upgrade_retunes_warm_and_publishes_the_new_best(cluster, namespace, simulator, operator, a100_nodes):
    doc = _a100_only("upgrade", "OnDriverChange", publish={"configMapName": "conv-tuned"})
    assert apply(cluster, namespace, doc).returncode == 0
    run = wait_phase(cluster, namespace, "upgrade", 180, operator)
    old_driver = next(iter(a100_nodes.values()))
    assert _target(run)["round"] == 1 and _target(run)["tunedFor"]["driverVersion"] == old_driver
    data = _published(cluster, namespace, "conv-tuned")
    assert old_driver in data["a100.4096x4096.fingerprint"]
    assert float(data["a100.4096x4096.time_ms"]) == pytest.approx(_target(run)["best"]["objectiveMs"], rel=1e-4)
    assert int(data["a100.4096x4096.block_size_x"]) == _target(run)["best"]["config"]["block_size_x"]

    _upgrade(cluster, a100_nodes)
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "upgrade")) and _target(r)["round"] == 2
        and r["status"]["phase"] == "Succeeded" and r,
        240, "the second round on the new driver",
    )
    target = _target(run)
    assert target["tunedFor"]["driverVersion"] == NEW_DRIVER
    assert target["completed"] == 5 and "stale" not in target
    assert _condition(run, "Stale")["status"] == "False"
    records = stored_records(cluster, namespace, "upgrade")
    rounds = {g: [r for r in records if r.round == g] for g in (1, 2)}
    assert len(rounds[1]) == 5 and len(rounds[2]) == 5, "the old round's results are kept"
    assert all(r.fingerprint.driver_version == NEW_DRIVER for r in rounds[2] if r.fingerprint)
    assert all(r.fingerprint.driver_version == old_driver for r in rounds[1] if r.fingerprint)
    assert "round 2: GPU fingerprint changed" in operator.logs()
    data = wait_for(
        lambda: NEW_DRIVER in (d := _published(cluster, namespace, "conv-tuned"))["a100.4096x4096.fingerprint"] and d,
        30, "the new best to be published",
    )
    assert json.loads(data["tuned.json"])


def test_manual_policy_only_marks_the_pool_stale_until_a_retune_is_requested(
    cluster, namespace, simulator, operator, a100_nodes
):
    assert apply(cluster, namespace, _a100_only("manual", "Manual", budget=4)).returncode == 0
    wait_phase(cluster, namespace, "manual", 180, operator)
    _upgrade(cluster, a100_nodes, "561.1.1")
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "manual")) and _condition(r, "Stale")["status"] == "True" and r,
        60, "the Stale condition",
    )
    stale = _condition(run, "Stale")["message"]
    assert "a100" in stale and "561.1.1" in stale and "→" in stale
    assert _target(run)["round"] == 1 and run["status"]["phase"] == "Succeeded"
    assert len(stored_records(cluster, namespace, "manual")) == 4, "Manual must not run anything by itself"

    cluster.kubectl("annotate", "-n", namespace, "tuningrun", "manual",
                    "fleettune.dev/retune-requested-at=2026-11-21T20:00:00Z")
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "manual")) and _target(r)["round"] == 2
        and r["status"]["phase"] == "Succeeded" and r,
        180, "the requested round",
    )
    assert run["status"]["lastHandledRetuneAt"] == "2026-11-21T20:00:00Z"
    assert _condition(run, "Stale")["status"] == "False"
    assert _target(run)["tunedFor"]["driverVersion"] == "561.1.1"
    assert len(stored_records(cluster, namespace, "manual")) == 8


def test_live_edits_and_reapplying_the_same_manifest(cluster, namespace, simulator, operator):
    doc = _a100_only("edits", "Manual", budget=4)
    assert apply(cluster, namespace, doc, "--server-side").returncode == 0
    run = wait_phase(cluster, namespace, "edits", 180, operator)
    generation, status = run["metadata"]["generation"], run["status"]

    # Server-side apply of the unchanged manifest (what Argo CD and Flux do) changes nothing.
    assert apply(cluster, namespace, doc, "--server-side").returncode == 0
    again = get_run(cluster, namespace, "edits")
    assert again["metadata"]["generation"] == generation
    assert again["status"]["trials"] == status["trials"] and len(stored_records(cluster, namespace, "edits")) == 4

    # A larger budget re-opens the finished pool; a lower parallelism deletes nothing.
    doc["spec"]["budget"].update(trialsPerTarget=7, parallelism=1)
    assert apply(cluster, namespace, doc, "--server-side").returncode == 0
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "edits"))["status"].get("observedGeneration") == generation + 1
        and r["status"]["phase"] == "Succeeded" and _target(r)["completed"] == 7 and r,
        180, "the extra trials",
    )
    assert _target(run)["round"] == 1

    # A new search space starts a new round; the old results stay addressable.
    for p in doc["spec"]["parameters"]:
        if p["name"] == "block_size_x":
            p["values"] = [16, 32, 64, 128]
    assert apply(cluster, namespace, doc, "--server-side").returncode == 0
    run = wait_for(
        lambda: (r := get_run(cluster, namespace, "edits")) and _target(r)["round"] == 2
        and r["status"]["phase"] == "Succeeded" and r,
        180, "the round on the new space",
    )
    records = stored_records(cluster, namespace, "edits")
    assert len([r for r in records if r.round == 1]) == 7
    assert len([r for r in records if r.round == 2]) == 7
    assert all(r.config["block_size_x"] in (16, 32, 64, 128) for r in records if r.round == 2)
    assert run["status"]["spaceHash"] != status["spaceHash"]


def test_several_problem_sizes_tune_side_by_side_learn_from_each_other_publish_each_and_predict_another(
    cluster, namespace, simulator, operator
):
    doc = _a100_only("sizes", "Manual", budget=6, publish={"configMapName": "sizes-tuned", "includePredicted": True},
                     predictFor=[[8192, 8192], [64]])
    kernel = doc["spec"]["kernel"]
    problem_size = kernel.pop("problemSize")
    kernel["problemSizes"] = [problem_size, [2048, 2048]]

    # The schema names the conflicts: both forms at once, and a size given twice.
    both = json.loads(json.dumps(doc))
    both["spec"]["kernel"]["problemSize"] = problem_size
    out = apply(cluster, namespace, both)
    assert out.returncode != 0 and "set exactly one of kernel.problemSize or kernel.problemSizes" in out.stderr
    twice = json.loads(json.dumps(doc))
    twice["spec"]["kernel"]["problemSizes"] = [problem_size, problem_size]
    out = apply(cluster, namespace, twice)
    assert out.returncode != 0 and "problem sizes must be unique" in out.stderr

    assert apply(cluster, namespace, doc).returncode == 0
    big, small = "a100.4096x4096", "a100.2048x2048"

    def both_measuring() -> bool:
        """A Job of each size is active at once (one size after the other: never)."""
        active = {job["metadata"]["labels"].get(TARGET_LABEL) for job in jobs(cluster, namespace, "sizes")
                  if (job.get("status") or {}).get("active")}
        return {big, small} <= active

    wait_for(both_measuring, 120, "a Job of each size at once")
    run = wait_phase(cluster, namespace, "sizes", 300, operator)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    targets = run["status"]["targets"]
    assert [t["name"] for t in targets] == [big, small]
    assert [t["problemSize"] for t in targets] == [[4096, 4096], [2048, 2048]]
    assert all(t["target"] == "a100" and t["phase"] == "Succeeded" and t["completed"] == 6 for t in targets)

    records = stored_records(cluster, namespace, "sizes")
    by_key = {key: [r for r in records if r.target == key] for key in (big, small)}
    assert len(records) == 12 and all(len(v) == 6 for v in by_key.values())
    assert all(r.problem_size == [2048, 2048] for r in by_key[small])
    # A size still measuring when the other's results came learned from them.
    learned = [(t["name"], s["name"]) for t in targets for s in t.get("learnedFrom", []) if s["kind"] == "Pool"]
    assert (big, small) in learned or (small, big) in learned, targets
    best_big = min((r for r in by_key[big] if r.objective), key=lambda r: r.objective)
    # The simulated fleet scales times with the problem's volume: the job ran the right size.
    default_key = next(r.key for r in by_key[big] if r.index == 0)
    times = {key: next(r.objective for r in v if r.key == default_key) for key, v in by_key.items()}
    assert times[small] == pytest.approx(times[big] / 4, rel=0.25)

    data = _published(cluster, namespace, "sizes-tuned")
    assert data["a100.sizes"] == "2048x2048,4096x4096"
    for key, target in ((big, targets[0]), (small, targets[1])):
        assert float(data[f"{key}.time_ms"]) == pytest.approx(target["best"]["objectiveMs"], rel=1e-4)

    predictions = {tuple(p["problemSize"]): p for p in run["status"]["predictions"]}
    assert set(predictions) == {(8192, 8192), (64,)} and all(p["target"] == "a100" for p in predictions.values())
    eight = predictions[(8192, 8192)]
    # The GP learns from each size's distinct measured configurations; a simulated failure drops one.
    valid = sum(len({r.key for r in v if r.objective}) for v in by_key.values())
    assert 10 <= valid <= 12 and f"GP over {valid} results at 2 tuned sizes" in eight["basis"]
    # Four times the work of the largest tuned size: slower than its best.
    assert eight["predictedMs"] > targets[0]["best"]["objectiveMs"] and set(eight["config"]) == set(best_big.config)
    assert predictions[(64,)]["basis"].startswith("spec.predictFor:") and "config" not in predictions[(64,)]
    # Opted in, the ConfigMap carries the prediction beside the measured sizes, marked so.
    data = wait_for(lambda: (d := _published(cluster, namespace, "sizes-tuned")).get("a100.predicted_sizes") and d,
                    60, "the published prediction")
    assert data["a100.predicted_sizes"] == "8192x8192" and data["a100.sizes"] == "2048x2048,4096x4096"
    assert data["a100.8192x8192.source"] == "predicted" and data["a100.8192x8192.basis"] == "sizes"
    assert {k: int(data[f"a100.8192x8192.{k}"]) for k in eight["config"]} == eight["config"]


def test_the_same_seed_repeats_a_sequential_run_exactly(cluster, namespace, simulator, operator):
    """What `strategy.seed` promises (docs/guide/budgets.md): with one trial at a time the
    order of results is fixed, so two runs that start from nothing (no fleet memory: the
    second would start from the first) measure the same configurations in the same order."""
    sequences = []
    for name in ("seeded-a", "seeded-b"):
        doc = _a100_only(name, "Manual", budget=8)
        doc["spec"]["budget"]["parallelism"] = 1
        doc["spec"]["fleetMemory"] = {"enabled": False}
        assert apply(cluster, namespace, doc).returncode == 0
        run = wait_phase(cluster, namespace, name, 240, operator)
        assert run["status"]["phase"] == "Succeeded", run["status"]
        records = sorted(stored_records(cluster, namespace, name), key=lambda r: r.index)
        sequences.append([(r.config, r.outcome, r.objective) for r in records])
    assert len(sequences[0]) == 8
    assert sequences[0] == sequences[1]
