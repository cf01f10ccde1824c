"""What a run publishes, and into which ConfigMap (no cluster).

`entries` selects the best of each pool's current round; `publish_plan` merges it into
what is published. Together: an entry follows its pool's round (a driver re-tune keeps the
old entry, labelled with its round, until the new round's first result replaces it even
when slower; an edited kernel withdraws it until measured again). A ConfigMap the run may
not write is refused, and read again on the run's schedule (`PUBLISH_RECHECK_S`), or at
once when its watch says it changed.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fleettune.api import PublishSpec, TuningRunSpec
from fleettune.controller import publisher as publisher_module
from fleettune.controller.pool import Pool
from fleettune.controller.publisher import PUBLISH_RECHECK_S, Publisher, entries
from fleettune.fingerprint import GpuFingerprint
from fleettune.labels import MANAGED_BY, MANAGER, PUBLISHED_BY
from fleettune.published import kernel_identity, publish_plan, published_configmap, read_entries
from fleettune.results import Records, TrialRecord
from fleettune.rollup import PUBLISH_REFUSED
from fleettune_job.protocol import Outcome

ROOT = Path(__file__).resolve().parents[3]
SPEC = TuningRunSpec.model_validate(yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"])
OLD = GpuFingerprint(product="NVIDIA-A100-PCIE-40GB", compute_capability="8.0", driver_version="550.54.15",
                     cuda_runtime_version="12.4")
NEW = OLD.model_copy(update={"driver_version": "560.35.03"})
K1, K2 = kernel_identity("space", "source-1"), kernel_identity("space", "source-2")
SLOT = "a100.4096x4096"


def pool(target: int = 0, round_: int = 1, tuned_for: GpuFingerprint | None = OLD) -> Pool:
    return Pool(spec=SPEC.targets[target], seed=0, problem_size=(4096, 4096), round=round_, tuned_for=tuned_for)


def rec(index: int, ms: float | None, round_: int = 1, target: str = "a100", bx: int | None = None) -> TrialRecord:
    bx = bx or 16 * (index + 1)
    return TrialRecord(target=target, index=index, config={"block_size_x": bx}, key=f"bx={bx}", round=round_,
                       outcome=Outcome.OK if ms else Outcome.COMPILE_ERROR, objective=ms,
                       recorded_at=f"2026-01-01T00:{index:02d}:00Z")


def step(published: dict[str, str] | None, pools: list[Pool], records: list[TrialRecord],
         kernel: str) -> dict[str, str] | None:
    """One publish as the run makes it: the current rounds' bests merged into what is there
    (the ConfigMap's data after it, unchanged when nothing is written)."""
    best = entries(pools, Records(records), kernel)
    plan = publish_plan("r", published, best, pools={p.spec.name for p in pools}, kernel=kernel)
    return published if plan is None else plan


# -- what is selected ------------------------------------------------------------------------

def test_only_the_current_rounds_records_are_selected() -> None:
    records = [rec(0, 0.4), rec(1, 0.9), rec(2, 5.0, round_=2), rec(3, 4.0, round_=2), rec(4, None, round_=2),
               rec(5, 0.1, target="rtx-a4000")]
    (best,) = entries([pool(round_=2, tuned_for=NEW)], Records(records), K1)
    # Round 1's 0.4 ms is faster, but measured on what the pool no longer is.
    assert (best.time_ms, best.round, best.trial, best.fingerprint, best.kernel) == (4.0, 2, 3, NEW, K1)
    assert best.pool == "a100" and best.problem_size == (4096, 4096)
    # A new round without a valid result yet: nothing to publish for the pool.
    assert entries([pool(round_=3)], Records(records), K1) == []
    assert entries([pool(round_=2)], Records([rec(4, None, round_=2)]), K1) == []
    # Plain sequences are read alike (found by target, not by `Records`' index).
    assert entries([pool(round_=2, tuned_for=NEW)], records, K1) == [best]


def test_each_pool_publishes_its_own_best() -> None:
    records = [rec(0, 2.0), rec(1, 1.0, target="rtx-a4000"), rec(2, 3.0, target="rtx-a4000")]
    got = entries([pool(0), pool(1)], Records(records), K1)
    assert [(e.pool, e.time_ms) for e in got] == [("a100", 2.0), ("rtx-a4000", 1.0)]


# -- a driver re-tune: the old entry stays until the new round's first result ----------------

def test_after_a_driver_change_the_old_entry_stays_until_replaced_even_by_a_slower_one() -> None:
    round1 = [rec(0, 0.5), rec(1, 0.42)]
    published = step(None, [pool()], round1, K1)
    assert published is not None and published[f"{SLOT}.generation"] == "1"
    # The driver changed: round 2 starts, tuned for the new driver, with no result yet.
    upgraded = pool(round_=2, tuned_for=NEW)
    assert step(published, [upgraded], round1, K1) is published  # nothing written
    (kept,) = read_entries(published)
    assert (kept.time_ms, kept.round, kept.fingerprint) == (0.42, 1, OLD)  # labelled with its round
    # Round 2's first result replaces it, although slower than round 1's.
    after = step(published, [upgraded], [*round1, rec(2, 0.61, round_=2)], K1)
    assert after is not None
    (now,) = read_entries(after)
    assert (now.time_ms, now.round, now.fingerprint, now.trial) == (0.61, 2, NEW, 2)
    assert after[f"{SLOT}.generation"] == "2" and after[f"{SLOT}.time_ms"] == "0.61"
    assert after[f"{SLOT}.fingerprint"].endswith("drv560.35.03_cuda12.4")
    # Within round 2, a slower result changes nothing, a faster one replaces it.
    assert step(after, [upgraded], [*round1, rec(2, 0.61, round_=2), rec(3, 0.7, round_=2)], K1) is after
    faster = step(after, [upgraded], [*round1, rec(2, 0.61, round_=2), rec(3, 0.55, round_=2)], K1)
    assert faster is not None and faster[f"{SLOT}.time_ms"] == "0.55"


def test_a_retune_of_the_same_kernel_keeps_every_entry_until_its_pool_has_a_result() -> None:
    records = [rec(0, 1.0), rec(1, 2.0, target="rtx-a4000")]
    published = step(None, [pool(0), pool(1)], records, K1)
    assert published is not None
    assert step(published, [pool(0, round_=2), pool(1)], records, K1) is published


# -- an edited kernel: the entry is withdrawn until the new round has a result ---------------

def test_after_a_source_edit_the_entry_is_withdrawn_until_the_new_round_has_a_result() -> None:
    records = [rec(0, 0.42), rec(1, 0.8, target="rtx-a4000")]
    published = step(None, [pool(0), pool(1)], records, K1)
    assert published is not None and {e.pool for e in read_entries(published)} == {"a100", "rtx-a4000"}
    # The source changed: another kernel identity, and a new round on every pool.
    edited = [pool(0, round_=2), pool(1, round_=2)]
    withdrawn = step(published, edited, records, K2)
    assert withdrawn is not None and read_entries(withdrawn) == []
    assert not any(k.startswith(("a100.", "rtx-a4000.")) for k in withdrawn)
    # One pool measures the new kernel: only it is published again, whatever its time.
    records += [rec(2, 3.0, round_=2)]
    back = step(withdrawn, edited, records, K2)
    assert back is not None
    assert [(e.pool, e.time_ms, e.round, e.kernel) for e in read_entries(back)] == [("a100", 3.0, 2, K2)]
    assert back[f"{SLOT}.kernel"] == K2 and back[f"{SLOT}.generation"] == "2"


def test_an_entry_of_another_kernel_is_never_kept_even_in_the_same_round() -> None:
    """After a restart the pool's round may be the one published, but under another kernel
    (its source changed while the operator was down): the old entry is not the kernel's."""
    published = step(None, [pool()], [rec(0, 0.42)], K1)
    assert published is not None
    assert read_entries(step(published, [pool()], [], K2) or {}) == []


# -- a ConfigMap the run may not write ------------------------------------------------------

class FakeKube:
    """ConfigMaps by name; counts reads, keeps writes."""

    def __init__(self, **maps: dict[str, Any]) -> None:
        self.maps = dict(maps)
        self.reads: list[str] = []
        self.writes: list[tuple[dict[str, Any], str | None]] = []
        self.fail_write: ApiException | None = None

    def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.reads.append(name)
        return copy.deepcopy(self.maps.get(name))

    def write_config_map(self, namespace: str, body: dict[str, Any], resource_version: str | None) -> str:
        if self.fail_write is not None:
            raise self.fail_write
        self.writes.append((body, resource_version))
        rv = str(len(self.writes))
        self.maps[body["metadata"]["name"]] = {**body, "metadata": {**body["metadata"], "resourceVersion": rv}}
        return rv


def foreign(name: str) -> dict[str, Any]:
    """An application's own ConfigMap of that name."""
    return {"metadata": {"name": name, "resourceVersion": "7", "labels": {"app": "mine"}}, "data": {"k": "v"}}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Seconds added to the publisher's monotonic clock (real time goes on: the event loop
    reads the same function)."""
    offset = [0.0]
    real = time.monotonic
    monkeypatch.setattr(publisher_module.time, "monotonic", lambda: real() + offset[0])
    return offset


def publish(pub: Publisher, target: PublishSpec | None, best: list | None = None) -> None:
    asyncio.run(pub.publish(target, {"a100"}, entries([pool()], [rec(0, 0.42)], K1) if best is None else best, K1))


def publisher(kube: FakeKube) -> Publisher:
    return Publisher(kube, "ns", "r", "uid-1", logging.getLogger("test"))  # type: ignore[arg-type]


def test_a_refused_name_is_read_again_after_the_interval_and_taken_once_free(clock: list[float]) -> None:
    kube = FakeKube(app=foreign("app"))
    pub, target = publisher(kube), PublishSpec(config_map_name="app")
    publish(pub, target)
    assert kube.reads == ["app"] and kube.writes == []
    assert pub.refused_name == "app"
    ok, reason, message = pub.condition() or (None, None, None)
    assert (ok, reason) == (False, PUBLISH_REFUSED) and "ConfigMap app exists and is not published by this run" \
        in message
    # Freed meanwhile; within the interval the refusal stands without another read.
    del kube.maps["app"]
    clock[0] += PUBLISH_RECHECK_S - 1
    publish(pub, target)
    assert kube.reads == ["app"] and kube.writes == [] and pub.refused_name == "app"
    # Past the interval: read again, found free, written (owned by the run, marked as its).
    clock[0] += 2
    publish(pub, target)
    assert kube.reads == ["app", "app"] and pub.refused_name is None
    (body, rv), = kube.writes
    assert rv is None and body["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert body["metadata"]["labels"][PUBLISHED_BY] == "r" and body["data"]["a100.4096x4096.time_ms"] == "0.42"
    assert pub.condition() == (True, "Published", "")


def test_a_refused_name_still_held_stays_refused_and_is_not_written(clock: list[float]) -> None:
    kube = FakeKube(app=foreign("app"))
    pub, target = publisher(kube), PublishSpec(config_map_name="app")
    for _ in range(3):
        publish(pub, target)
        clock[0] += PUBLISH_RECHECK_S + 1
    assert kube.reads == ["app"] * 3 and kube.writes == [] and pub.refused_name == "app"
    assert kube.maps["app"] == foreign("app")


def test_a_change_seen_by_the_watch_is_read_at_once(clock: list[float]) -> None:
    kube = FakeKube(app=foreign("app"))
    pub, target = publisher(kube), PublishSpec(config_map_name="app")
    publish(pub, target)
    del kube.maps["app"]
    pub.recheck()  # its watch saw it deleted: no need to wait out the interval
    publish(pub, target)
    assert kube.reads == ["app", "app"] and len(kube.writes) == 1 and pub.refused_name is None


def test_another_name_is_read_at_once_and_no_target_refuses_nothing(clock: list[float]) -> None:
    kube = FakeKube(app=foreign("app"))
    pub = publisher(kube)
    publish(pub, PublishSpec(config_map_name="app"))
    publish(pub, PublishSpec(config_map_name="tuned", retain_on_delete=True))
    assert kube.reads == ["app", "tuned"] and pub.refused_name is None
    (body, _), = kube.writes
    assert body["metadata"]["name"] == "tuned" and "ownerReferences" not in body["metadata"]
    publish(pub, None)
    assert pub.refused_name is None and pub.condition() is None


def test_a_published_map_is_not_read_again_within_the_interval(clock: list[float]) -> None:
    mine = published_configmap("r", "ns", "uid-1", [], name="tuned")
    mine["metadata"]["resourceVersion"] = "3"
    kube = FakeKube(tuned=mine)
    pub, target = publisher(kube), PublishSpec(config_map_name="tuned")
    publish(pub, target)
    assert kube.writes[-1][1] == "3"  # over the version read
    publish(pub, target, entries([pool()], [rec(0, 0.42), rec(1, 0.3)], K1))
    assert kube.reads == ["tuned"] and len(kube.writes) == 2 and kube.writes[-1][1] == "1"
    # A write that finds it gone or changed reads it again on the next publish, at once.
    kube.fail_write = ApiException(status=409)
    publish(pub, target, entries([pool()], [rec(0, 0.42), rec(1, 0.2)], K1))
    assert pub.condition() == (True, "Published", "")  # a conflict is no failure: retried
    kube.fail_write = None
    publish(pub, target, entries([pool()], [rec(0, 0.42), rec(1, 0.2)], K1))
    assert kube.reads == ["tuned", "tuned"] and kube.writes[-1][0]["data"]["a100.4096x4096.time_ms"] == "0.2"
    assert kube.maps["tuned"]["metadata"]["labels"][MANAGED_BY] == MANAGER
