"""The results stores as the fleet's memory (no cluster): a run that retains its results
writes shards with no owner that stay its own, and `MemoryReader` reads the records of one
kernel from live and retained runs, never a deleted run's or the reader's own."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_store_lost import RUN, UID, FakeCore, rec

from fleettune import store as store_module
from fleettune.store import MemoryReader, ResultsStore


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> FakeCore:
    monkeypatch.setattr(store_module, "SHARD_RECORDS", 2)  # a few records fill shards
    return FakeCore()


class FakeCustom:
    """The TuningRuns a namespace lists (their uids); a namespace in ``forbidden`` answers 403."""

    def __init__(self, live: dict[str, str], forbidden: tuple[str, ...] = ()) -> None:
        self.live, self.forbidden = live, forbidden

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str) -> dict[str, Any]:
        if namespace in self.forbidden:
            raise ApiException(status=403, reason="Forbidden")
        return {"items": [{"metadata": {"name": name, "uid": uid}} for uid, name in self.live.items()]}


def store_of(core: FakeCore, run: str, uid: str, n: int, kernel: str = "k", retained: bool = False) -> ResultsStore:
    store = ResultsStore(core, "ns", run, uid)  # type: ignore[arg-type]
    store.load()
    store.retain(retained)
    store.append([rec(i).model_copy(update={"kernel": kernel}) for i in range(n)])
    return store


def owners(core: FakeCore) -> list[int]:
    return [len(cm.metadata.owner_references or []) for cm in core.maps.values()]


def test_a_retained_store_has_no_owner_and_stays_its_runs_own(core: FakeCore) -> None:
    store = store_of(core, RUN, UID, 3)
    assert owners(core) == [1, 1]
    store.retain(True)  # the shards written already are rewritten without their owner
    assert owners(core) == [0, 0]
    store.append([rec(3), rec(4)])  # and the new ones are written without one
    assert owners(core) == [0, 0, 0]
    reread = ResultsStore(core, "ns", RUN, UID)  # type: ignore[arg-type]  # after a restart
    assert [r.index for r in reread.load()] == [0, 1, 2, 3, 4]
    assert reread.append([rec(2)]) == []  # its own: never stored twice
    assert ResultsStore(core, "ns", RUN, "uid-2").load() == []  # type: ignore[arg-type]  # never another's
    store.retain(False)
    assert owners(core) == [1, 1, 1]


def test_the_memory_reads_live_and_retained_runs_of_the_kernel_only(core: FakeCore) -> None:
    store_of(core, "live", "uid-live", 3)
    store_of(core, "deleted", "uid-deleted", 2)  # its owner is gone: the collector's, not ours
    store_of(core, "kept", "uid-kept", 2, retained=True)
    store_of(core, "other-kernel", "uid-other", 2, kernel="another")
    store_of(core, "me", "uid-me", 2)
    reader = MemoryReader(core, FakeCustom({"uid-live": "live", "uid-other": "other-kernel",  # type: ignore[arg-type]
                                            "uid-me": "me"}))
    runs, problems = reader.read(["ns"], "k", "uid-me")
    assert problems == []
    assert sorted((r.name, r.uid, r.retained, [x.index for x in r.records]) for r in runs) == [
        ("kept", "uid-kept", True, [0, 1]), ("live", "uid-live", False, [0, 1, 2])]
    assert {r.label("ns") for r in runs} == {"kept", "live"} and runs[0].label("team-b").startswith("ns/")


def test_each_shard_is_decoded_once_per_version(core: FakeCore, monkeypatch: pytest.MonkeyPatch) -> None:
    live = store_of(core, "live", "uid-live", 3)
    decoded: list[int] = []
    real = store_module.decode_shard
    monkeypatch.setattr(store_module, "decode_shard", lambda data: decoded.append(1) or real(data))
    reader = MemoryReader(core, FakeCustom({"uid-live": "live"}))  # type: ignore[arg-type]
    reader.read(["ns"], "k", "uid-me")
    reader.read(["ns"], "k", "uid-me")
    assert len(decoded) == 2  # two shards, read twice
    live.append([rec(3).model_copy(update={"kernel": "k"})])  # the last shard changes
    runs, _ = reader.read(["ns"], "k", "uid-me")
    assert len(decoded) == 3 and [r.index for r in runs[0].records] == [0, 1, 2, 3]


def test_a_namespace_it_may_not_read_is_one_problem_and_the_others_are_read(core: FakeCore) -> None:
    store_of(core, "live", "uid-live", 1)
    reader = MemoryReader(core, FakeCustom({"uid-live": "live"}, forbidden=("team-b",)))  # type: ignore[arg-type]
    runs, problems = reader.read(["ns", "team-b"], "k", "uid-me")
    assert [r.name for r in runs] == ["live"]
    assert problems == ["cannot read the results stores in namespace team-b: 403 Forbidden"]
