"""A results shard deleted by hand (no cluster): the store finds it gone at its next
listing or write, hands its records over once (`ResultsStore.take_lost`), and the run
announces it in a ResultsLost event naming the shard and counting what is lost and what
remains."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fleettune import store as store_module
from fleettune.results import TrialRecord
from fleettune.store import DATA_KEY, ResultsStore, record_id, shard_name
from fleettune_job.protocol import Outcome

RUN, UID = "conv", "uid-1"


def _answer(rv: str) -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps({"metadata": {"resourceVersion": rv}}).encode())


class FakeCore:
    """ConfigMaps by name, as the API server keeps them: a create over an existing name and
    a replace over another version conflict (409), a replace of a missing one is 404."""

    def __init__(self) -> None:
        self.maps: dict[str, client.V1ConfigMap] = {}
        self.version = 0

    def _put(self, body: dict[str, Any]) -> SimpleNamespace:
        self.version += 1
        meta = body["metadata"]
        owners = [client.V1OwnerReference(api_version=o["apiVersion"], kind=o["kind"], name=o["name"], uid=o["uid"])
                  for o in meta.get("ownerReferences", [])]
        self.maps[meta["name"]] = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=meta["name"], resource_version=str(self.version),
                                         labels=meta.get("labels"), owner_references=owners),
            binary_data=dict(body.get("binaryData") or {}))
        return _answer(str(self.version))

    def list_namespaced_config_map(self, namespace: str, label_selector: str) -> SimpleNamespace:
        return SimpleNamespace(items=list(self.maps.values()))

    def create_namespaced_config_map(self, namespace: str, body: dict[str, Any], **_: Any) -> SimpleNamespace:
        if body["metadata"]["name"] in self.maps:
            raise ApiException(status=409)
        return self._put(body)

    def replace_namespaced_config_map(self, name: str, namespace: str, body: dict[str, Any],
                                      **_: Any) -> SimpleNamespace:
        held = self.maps.get(name)
        if held is None:
            raise ApiException(status=404)
        if held.metadata.resource_version != body["metadata"]["resourceVersion"]:
            raise ApiException(status=409)
        return self._put(body)

    def read_namespaced_config_map(self, name: str, namespace: str, **_: Any) -> SimpleNamespace:
        held = self.maps.get(name)
        if held is None:
            raise ApiException(status=404)
        owners = [{"uid": o.uid} for o in held.metadata.owner_references or []]
        meta = {"ownerReferences": owners, "labels": held.metadata.labels}
        return SimpleNamespace(data=json.dumps({"metadata": meta}).encode())


def rec(index: int, target: str = "a100") -> TrialRecord:
    return TrialRecord(target=target, index=index, config={"bx": index}, key=str(index), outcome=Outcome.OK,
                       objective=1.0 + index)


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> FakeCore:
    monkeypatch.setattr(store_module, "SHARD_RECORDS", 2)  # a few records fill shards
    monkeypatch.setattr(ResultsStore, "BACKOFF_S", 0.0)
    return FakeCore()


def filled(core: FakeCore, n: int = 5) -> ResultsStore:
    store = ResultsStore(core, "ns", RUN, UID)  # type: ignore[arg-type]
    store.load()
    store.append([rec(i) for i in range(n)])
    return store


def test_a_shard_deleted_by_hand_is_reported_once_with_the_records_it_held(core: FakeCore) -> None:
    store = filled(core)
    names = [shard_name(RUN, UID, i) for i in range(3)]
    assert sorted(core.maps) == names and store.shards == 3
    store.load()
    assert store.take_lost() == []  # everything is still there
    del core.maps[names[1]]
    store.load()
    assert store.take_lost() == [(names[1], [rec(2), rec(3)])]
    assert store.take_lost() == []  # handed over once
    store.load()
    assert store.take_lost() == []
    # What remains is what the store holds and counts; the lost records may be stored again.
    assert store.records == [rec(0), rec(1), rec(4)] and store.shards == 2
    assert record_id(rec(2)) not in store and record_id(rec(4)) in store
    assert store.append([rec(2)]) == [rec(2)]


def test_a_fresh_store_reports_nothing_lost(core: FakeCore) -> None:
    """An operator that starts (or restarts) finds the shards as they are: what it never
    read, it cannot have lost."""
    filled(core)
    del core.maps[shard_name(RUN, UID, 0)]
    fresh = ResultsStore(core, "ns", RUN, UID)  # type: ignore[arg-type]
    fresh.load()
    assert fresh.take_lost() == [] and [r.index for r in fresh.records] == [2, 3, 4]


def test_shards_of_another_run_are_neither_read_nor_lost(core: FakeCore) -> None:
    other = filled(core)
    mine = ResultsStore(core, "ns", RUN, "uid-2")  # type: ignore[arg-type]  # same name, another uid
    assert mine.load() == []
    core.maps.clear()
    mine.load()
    assert mine.take_lost() == []
    other.load()
    assert sorted(name for name, _ in other.take_lost()) == [shard_name(RUN, UID, i) for i in range(3)]


def test_a_write_into_a_deleted_shard_reports_it_and_stores_the_new_records(core: FakeCore) -> None:
    store = filled(core, 3)  # 0000 full, 0001 holds one: the next record goes there
    last = shard_name(RUN, UID, 1)
    del core.maps[last]
    assert store.append([rec(3)]) == [rec(3)]
    # What the shard held is lost; the record being written is not (stored anew).
    assert store.take_lost() == [(last, [rec(2)])]
    assert [r.index for r in store.records] == [0, 1, 3]
    reread = ResultsStore(core, "ns", RUN, UID)  # type: ignore[arg-type]
    assert [r.index for r in reread.load()] == [0, 1, 3]


def test_the_shards_data_decodes_to_what_was_stored(core: FakeCore) -> None:
    filled(core, 2)
    (shard,) = core.maps.values()
    assert set(shard.binary_data) == {DATA_KEY}
    assert [r.index for r in store_module.decode_shard(shard.binary_data[DATA_KEY])] == [0, 1]


# -- the run's announcement -----------------------------------------------------------------

class LostStore:
    """A store that found one shard deleted: what `RunLoop._note_lost` reads of it."""

    def __init__(self, lost: list[tuple[str, list[TrialRecord]]], remaining: list[TrialRecord]) -> None:
        self.lost, self.records = lost, remaining

    def take_lost(self) -> list[tuple[str, list[TrialRecord]]]:
        lost, self.lost = self.lost, []
        return lost


def test_the_results_lost_event_names_the_shard_and_counts(caplog: pytest.LogCaptureFixture) -> None:
    from fleettune.controller.tuner import RunLoop

    kube = SimpleNamespace(core=None, custom=None)
    loop = RunLoop(kube, {"metadata": {"name": RUN, "namespace": "ns", "uid": UID}, "spec": {}},  # type: ignore[arg-type]
                   logging.getLogger("test"))
    gone = shard_name(RUN, UID, 1)
    loop.store = LostStore([(gone, [rec(2), rec(3)])], [rec(0), rec(1), rec(4)])  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, logger="test"):
        loop._note_lost()
    (event,) = [e for e in loop.planner.events if e[1] == "ResultsLost"]
    assert event == ("Warning", "ResultsLost",
                     f"results ConfigMap {gone} was deleted: its 2 record(s) are lost; the 3 that remain are counted")
    assert gone in caplog.text
    loop._note_lost()  # handed over once: announced once
    assert [e[1] for e in loop.planner.events].count("ResultsLost") == 1
