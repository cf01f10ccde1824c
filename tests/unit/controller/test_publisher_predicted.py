"""spec.publish.includePredicted: the run's predictions fill the published slots that have
no measured best, marked as predictions, and never take a measured entry's place."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleettune.api import PublishSpec, TuningRunSpec
from fleettune.controller.pool import Pool
from fleettune.controller.publisher import Publisher, entries, predicted
from fleettune.fingerprint import GpuFingerprint
from fleettune.published import (
    MAX_BYTES,
    TUNED_JSON,
    PredictedEntry,
    PublishedEntry,
    configmap_data,
    publish_plan,
    read_entries,
)
from fleettune.results import Records, TrialRecord
from fleettune_job.protocol import Outcome

ROOT = Path(__file__).resolve().parents[3]
SPEC = TuningRunSpec.model_validate(yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"])
OLD = GpuFingerprint(product="NVIDIA-A100-PCIE-40GB", driver_version="550.54.15")
NEW = OLD.model_copy(update={"driver_version": "560.35.03"})
K1 = "k1"
SIZE = [4096, 4096]
# status.predictions as the reporter keeps them (camelCase): a100 at a size never tuned
# (source sizes, no `source` key as `prediction.Recommendation` writes it), rtx-a4000 with
# no valid result yet (source gpus), and a size that had nothing to predict from.
PREDICTIONS: list[dict[str, Any]] = [
    {"target": "a100", "problemSize": [8192, 8192], "config": {"block_size_x": 128}, "predictedMs": 3.5,
     "basis": "GP over 2 sizes"},
    {"target": "rtx-a4000", "problemSize": SIZE, "source": "gpus", "config": {"block_size_x": 64},
     "expectedFraction": 0.91, "expectedFractionRange": [0.8, 1.0], "basis": "consensus of a100, jetson-orin"},
    {"target": "rtx-a4000", "problemSize": [8192, 8192], "basis": "no valid result yet"},
]


def pool(target: int = 0, round_: int = 1, tuned_for: GpuFingerprint | None = OLD) -> Pool:
    return Pool(spec=SPEC.targets[target], seed=0, problem_size=(4096, 4096), round=round_, tuned_for=tuned_for)


def rec(index: int, ms: float | None, target: str = "a100", round_: int = 1) -> TrialRecord:
    bx = 16 * (index + 1)
    return TrialRecord(target=target, index=index, config={"block_size_x": bx}, key=f"bx={bx}", round=round_,
                       outcome=Outcome.OK if ms else Outcome.COMPILE_ERROR, objective=ms,
                       recorded_at=f"2026-01-01T00:{index:02d}:00Z")


def step(published: dict[str, str] | None, pools: list[Pool], records: list[TrialRecord],
         predictions: list[dict[str, Any]] = PREDICTIONS) -> dict[str, str] | None:
    """One publish with includePredicted, as the run makes it (the data after it)."""
    plan = publish_plan("r", published, entries(pools, Records(records), K1), pools={p.spec.name for p in pools},
                        kernel=K1, predicted=predicted(predictions, K1))
    return published if plan is None else plan


def doc_entries(data: dict[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    doc = json.loads(data[TUNED_JSON])
    return {(e["pool"], "x".join(map(str, e["problemSize"]))): e for e in doc["entries"]}


class FakeKube:
    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.writes: list[dict[str, Any]] = []

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.maps.get(name))

    def write_config_map(self, namespace: str, body: dict[str, Any], resource_version: str | None) -> str:
        self.writes.append(body)
        rv = str(len(self.writes))
        self.maps[body["metadata"]["name"]] = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
        return rv


def run_publish(include: bool | None) -> dict[str, str]:
    kube = FakeKube()
    pub = Publisher(kube, "ns", "r", "uid-1", logging.getLogger("test"))  # type: ignore[arg-type]
    target = PublishSpec(config_map_name="tuned", **({} if include is None else {"include_predicted": include}))
    best = entries([pool(0), pool(1)], [rec(0, 0.42)], K1)
    asyncio.run(pub.publish(target, {"a100", "rtx-a4000"}, best, K1, PREDICTIONS))
    (body,) = kube.writes
    return body["data"]


def test_predictions_are_published_only_when_opted_in() -> None:
    assert PublishSpec.model_validate({"configMapName": "t", "includePredicted": True}).include_predicted
    for include in (None, False):
        data = run_publish(include)
        assert set(doc_entries(data)) == {("a100", "4096x4096")}
        assert not any(k.startswith("rtx-a4000.") or ".8192x8192." in k for k in data)
        assert not any(k.endswith((".source", ".predicted_sizes")) for k in data)
    data = run_publish(True)
    assert set(doc_entries(data)) == {("a100", "4096x4096"), ("a100", "8192x8192"), ("rtx-a4000", "4096x4096")}
    assert data["rtx-a4000.4096x4096.block_size_x"] == "64" and data["a100.8192x8192.block_size_x"] == "128"


def test_predicted_entries_are_marked_with_their_basis_and_expected_fraction() -> None:
    data = step(None, [pool(0), pool(1)], [rec(0, 0.42)])
    assert data is not None
    docs = doc_entries(data)
    measured, gpus, sizes = docs["a100", "4096x4096"], docs["rtx-a4000", "4096x4096"], docs["a100", "8192x8192"]
    assert "source" not in measured and measured["timeMs"] == 0.42  # measured: as before, no source key
    assert gpus == {"pool": "rtx-a4000", "problemSize": SIZE, "config": {"block_size_x": 64}, "source": "predicted",
                    "basis": "gpus", "kernel": K1, "expectedFraction": 0.91, "expectedFractionRange": [0.8, 1.0]}
    assert (sizes["source"], sizes["basis"], sizes["predictedMs"]) == ("predicted", "sizes", 3.5)
    assert "timeMs" not in gpus and "timeMs" not in sizes  # nothing was timed
    assert data["rtx-a4000.4096x4096.source"] == "predicted" and data["rtx-a4000.4096x4096.basis"] == "gpus"
    assert data["rtx-a4000.4096x4096.expected_fraction"] == "0.91"
    assert data["a100.8192x8192.source"] == "predicted" and data["a100.8192x8192.basis"] == "sizes"
    assert "a100.4096x4096.source" not in data
    # `sizes` lists the measured ones; the predicted are listed apart.
    assert data["a100.sizes"] == "4096x4096" and data["a100.predicted_sizes"] == "8192x8192"
    assert data["rtx-a4000.predicted_sizes"] == "4096x4096" and "rtx-a4000.sizes" not in data
    # Predictions are not read back as results.
    assert [(e.pool, e.problem_size) for e in read_entries(data)] == [("a100", (4096, 4096))]


def test_the_measured_best_replaces_the_prediction_when_it_lands() -> None:
    before = step(None, [pool(0), pool(1)], [rec(0, 0.42)])
    assert before is not None and before["rtx-a4000.4096x4096.source"] == "predicted"
    # rtx-a4000 measures; the status still holds its prediction (refreshed later).
    after = step(before, [pool(0), pool(1)], [rec(0, 0.42), rec(1, 0.9, target="rtx-a4000")])
    assert after is not None
    e = doc_entries(after)["rtx-a4000", "4096x4096"]
    assert "source" not in e and e["timeMs"] == 0.9 and e["config"] == {"block_size_x": 32}
    assert "rtx-a4000.4096x4096.source" not in after and "rtx-a4000.4096x4096.basis" not in after
    assert after["rtx-a4000.4096x4096.block_size_x"] == "32" and after["rtx-a4000.sizes"] == "4096x4096"
    assert "rtx-a4000.predicted_sizes" not in after


def test_a_prediction_never_displaces_a_measured_entry() -> None:
    stale = [*PREDICTIONS, {"target": "a100", "problemSize": SIZE, "source": "gpus", "config": {"block_size_x": 256}}]
    data = step(None, [pool(0), pool(1)], [rec(0, 0.42)], stale)
    assert data is not None
    assert "source" not in doc_entries(data)["a100", "4096x4096"] and data["a100.4096x4096.block_size_x"] == "16"
    assert step(data, [pool(0), pool(1)], [rec(0, 0.42)], stale) is data  # nothing to write


def test_a_prediction_never_displaces_the_old_rounds_entry_kept_after_a_driver_change() -> None:
    round1 = [rec(0, 0.42)]
    published = step(None, [pool(0)], round1, [])
    assert published is not None
    # Round 2 (new driver) has no valid result: the reporter predicts a100 from the other GPUs.
    guess = [{"target": "a100", "problemSize": SIZE, "source": "gpus", "config": {"block_size_x": 256}}]
    upgraded = [pool(0, round_=2, tuned_for=NEW)]
    assert step(published, upgraded, [*round1, rec(1, None, round_=2)], guess) is published
    (kept,) = read_entries(published)
    assert (kept.round, kept.config) == (1, {"block_size_x": 16})


def test_turning_it_off_withdraws_the_published_predictions() -> None:
    data = step(None, [pool(0), pool(1)], [rec(0, 0.42)])
    off = step(data, [pool(0), pool(1)], [rec(0, 0.42)], [])
    assert off is not None and off == configmap_data("r", read_entries(off))
    assert set(doc_entries(off)) == {("a100", "4096x4096")}


def test_an_unchanged_result_is_byte_identical_whatever_the_order() -> None:
    first = step(None, [pool(0), pool(1)], [rec(0, 0.42)])
    assert first is not None
    assert step(first, [pool(0), pool(1)], [rec(0, 0.42)]) is first  # nothing written
    again = step(None, [pool(1), pool(0)], [rec(0, 0.42)], list(reversed(PREDICTIONS)))
    assert again == first and list(again) == sorted(again)
    assert [list(d) for d in doc_entries(first)] == [list(d) for d in doc_entries(again)]
    # Two predictions for one slot: the same one is chosen whatever their order.
    both = [{"target": "a100", "problemSize": [64], "config": {"block_size_x": 32}},
            {"target": "a100", "problemSize": [64], "source": "gpus", "config": {"block_size_x": 48}}]
    one, other = (configmap_data("r", [], predicted(b, K1)) for b in (both, both[::-1]))
    assert one == other and one["a100.64.basis"] == "gpus"


def test_predictions_are_left_out_first_when_the_budget_is_exceeded() -> None:
    def measured(i: int) -> PublishedEntry:
        return PublishedEntry(pool=f"p{i:03d}", problem_size=(8,), config={f"param_{j}": "v" * 200 for j in range(40)},
                              time_ms=1.0, kernel=K1)

    def guess(i: int) -> PredictedEntry:
        return PredictedEntry(pool=f"q{i:02d}", problem_size=(8,), basis="gpus",
                              config={f"param_{j}": "v" * 200 for j in range(40)})

    fits = [measured(i) for i in range(40)]  # about half the budget
    data = configmap_data("r", fits, [guess(i) for i in reversed(range(60))])  # the first slots are kept
    assert sum(len(k) + len(v.encode()) for k, v in data.items()) <= MAX_BYTES
    assert read_entries(data) == fits  # every measured entry is there
    kept = [e for e in json.loads(data[TUNED_JSON])["entries"] if e.get("source") == "predicted"]
    assert 0 < len(kept) < 60 and [e["pool"] for e in kept] == [f"q{i:02d}" for i in range(len(kept))]
    assert json.loads(data[TUNED_JSON])["predictedLeftOut"] == 60 - len(kept)
    assert "predictedLeftOut" not in json.loads(configmap_data("r", fits, [guess(0)])[TUNED_JSON])
    # Measured entries alone over the budget: refused as before.
    with pytest.raises(ValueError, match="ConfigMap budget"):
        configmap_data("r", [measured(i) for i in range(120)], [guess(0)])


def test_predictions_without_a_configuration_are_not_published() -> None:
    got = predicted([*PREDICTIONS, {"target": "a100", "problemSize": [1], "config": {}, "bogus": 1}], K1)
    assert [(p.pool, p.problem_size, p.basis) for p in got] == [
        ("a100", (8192, 8192), "sizes"), ("rtx-a4000", (4096, 4096), "gpus")]
