"""The watch-fed Jobs cache behind ``Kube.list_jobs`` (no cluster: a fake BatchV1Api), and the
ended trial Pods behind ``Kube.ended_pod``."""

from __future__ import annotations

import json
from typing import Any

from fleettune.controller.kube import Kube
from fleettune.controller.watch import EndedPods, StreamedAnswers, WatchCache, answers_in_log, parse_selector
from fleettune.labels import BATCH_LABEL
from fleettune_job.protocol import Answer, Outcome, TrialResult

MANAGED = {"app.kubernetes.io/managed-by": "fleettune"}
SEL_A = "app.kubernetes.io/managed-by=fleettune,fleettune.dev/run=a"


def job(name: str, run: str = "a", rv: int = 1, uid: str | None = None, done: bool = False) -> dict[str, Any]:
    status = {"conditions": [{"type": "Complete", "status": "True"}]} if done else {"active": 1}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid or f"uid-{name}", "resourceVersion": str(rv),
                         "labels": {**MANAGED, "fleettune.dev/run": run}}, "status": status}


class _Resp:
    def __init__(self, payload: dict[str, Any]) -> None:
        self.data = json.dumps(payload).encode()


class FakeBatch:
    """What the apiserver holds; counts the real lists."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.rv = 100
        self.lists = 0

    def list_namespaced_job(self, namespace: str, label_selector: str, _preload_content: bool) -> _Resp:
        self.lists += 1
        want = parse_selector(label_selector) or {}
        items = [j for j in self.jobs.values()
                 if all(j["metadata"]["labels"].get(k) == v for k, v in want.items())]
        return _Resp({"metadata": {"resourceVersion": str(self.rv)}, "items": items})

    def create_namespaced_job(self, namespace: str, body: dict[str, Any], _preload_content: bool) -> _Resp:
        self.rv += 1
        obj = json.loads(json.dumps(body))
        obj["metadata"].update(namespace=namespace, uid=f"uid-{body['metadata']['name']}",
                               resourceVersion=str(self.rv))
        self.jobs[obj["metadata"]["name"]] = obj
        return _Resp(obj)

    def delete_namespaced_job(self, name: str, namespace: str, propagation_policy: str,
                              _preload_content: bool) -> _Resp:
        self.jobs.pop(name, None)
        return _Resp({"kind": "Status"})


def kube_with(cache: WatchCache) -> tuple[Kube, FakeBatch]:
    k = Kube(api=object(), job_cache=cache)  # type: ignore[arg-type]
    fake = FakeBatch()
    k.__dict__["batch"] = fake  # cached_property slot
    return k, fake


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(i["metadata"]["name"] for i in items)


def test_parse_selector() -> None:
    assert parse_selector("a=b,c==d") == {"a": "b", "c": "d"}
    assert parse_selector("") == {}
    for bad in ("a!=b", "a in (b)", "a", "!a"):
        assert parse_selector(bad) is None


def test_real_list_until_the_watch_has_spoken_then_the_cache() -> None:
    cache = WatchCache(required=MANAGED, resync_s=60)
    k, api = kube_with(cache)
    api.jobs["j1"] = job("j1", rv=5)
    assert names(k.list_jobs("ns", SEL_A)) == ["j1"]
    assert names(k.list_jobs("ns", SEL_A)) == ["j1"]
    assert api.lists == 2  # no watch event yet: every call is a real list
    cache.observe("MODIFIED", job("j1", rv=6, done=True))
    assert names(k.list_jobs("ns", SEL_A)) == ["j1"]
    assert api.lists == 2
    assert "conditions" in k.list_jobs("ns", SEL_A)[0]["status"]


def test_own_creates_and_deletes_show_at_once_and_stale_events_do_not_resurrect() -> None:
    cache = WatchCache(required=MANAGED, resync_s=60)
    k, api = kube_with(cache)
    cache.observe(None, job("other", run="b"))
    k.list_jobs("ns", SEL_A)  # the authoritative first list
    body = job("j2")
    del body["metadata"]["uid"], body["metadata"]["resourceVersion"]
    assert k.create_job("ns", body)
    assert names(k.list_jobs("ns", SEL_A)) == ["j2"]
    done = job("j2", rv=api.rv + 1, done=True)
    cache.observe("MODIFIED", done)
    k.delete_job("ns", "j2")
    assert k.list_jobs("ns", SEL_A) == []
    cache.observe("MODIFIED", done)  # an event already in flight when we deleted it
    assert k.list_jobs("ns", SEL_A) == []
    cache.observe("DELETED", done)
    assert k.list_jobs("ns", SEL_A) == []
    assert api.lists == 1


def test_older_events_do_not_overwrite_newer_state() -> None:
    cache = WatchCache(required=MANAGED, resync_s=60)
    cache.observe("MODIFIED", job("j", rv=10, done=True))
    cache.observe("MODIFIED", job("j", rv=9))
    cache.listed("ns", SEL_A, [job("j", rv=8)], "8", 0.0)
    assert cache._objects["ns"]["j"]["metadata"]["resourceVersion"] == "10"


def test_resync_drops_what_a_broken_watch_missed_but_keeps_newer_jobs() -> None:
    cache = WatchCache(required=MANAGED, resync_s=0.0)  # every call a real list
    k, api = kube_with(cache)
    cache.observe("ADDED", job("ghost", rv=3))  # deleted while the watch was down
    cache.observe("ADDED", job("new", rv=200))  # created after the list's snapshot
    api.jobs["kept"] = job("kept", rv=50)
    assert names(k.list_jobs("ns", SEL_A)) == ["kept"]
    assert sorted(cache._objects["ns"]) == ["kept", "new"]


def test_selectors_the_cache_cannot_answer_are_real_lists() -> None:
    cache = WatchCache(required=MANAGED, resync_s=60)
    k, api = kube_with(cache)
    cache.observe("ADDED", job("j"))
    for sel in ("fleettune.dev/run=a", "app.kubernetes.io/managed-by=fleettune,fleettune.dev/run!=a"):
        k.list_jobs("ns", sel)
        k.list_jobs("ns", sel)
    assert api.lists == 4


def test_no_cache_is_the_plain_list() -> None:
    k = Kube(api=object())  # type: ignore[arg-type]
    fake = FakeBatch()
    k.__dict__["batch"] = fake
    fake.jobs["j"] = job("j")
    assert names(k.list_jobs("ns", SEL_A)) == ["j"]
    assert k.create_job("ns", {"metadata": {"name": "k", "labels": dict(MANAGED)}})
    k.delete_job("ns", "k")
    assert fake.lists == 1


def test_background_delete_hides_the_job_at_once_and_a_failed_one_comes_back() -> None:
    from kubernetes.client.exceptions import ApiException

    cache = WatchCache(required=MANAGED, resync_s=60)
    k = Kube(api=object(), job_cache=cache, background_deletes=True)  # type: ignore[arg-type]
    fake = FakeBatch()
    k.__dict__["batch"] = fake
    fake.jobs["j"] = job("j", rv=5, done=True)
    cache.observe("ADDED", job("j", rv=5, done=True))
    k.list_jobs("ns", SEL_A)
    k.delete_job("ns", "j")
    assert k.list_jobs("ns", SEL_A) == []
    k.deleter.shutdown(wait=True)  # type: ignore[union-attr]
    assert "j" not in fake.jobs

    def refuse(*_: Any, **__: Any) -> None:
        raise ApiException(status=503, reason="unavailable")

    fake.jobs["k"] = job("k", rv=7, done=True)
    cache.observe("ADDED", job("k", rv=7, done=True))
    fake.delete_namespaced_job = refuse  # type: ignore[method-assign]
    k = Kube(api=object(), job_cache=cache, background_deletes=True)  # type: ignore[arg-type]
    k.__dict__["batch"] = fake
    k.delete_job("ns", "k")
    k.deleter.shutdown(wait=True)  # type: ignore[union-attr]
    assert names(k.list_jobs("ns", SEL_A)) == ["k"]  # back, from a real list: its run deletes it again


def test_pods_of_a_cached_job_are_listed_no_older_than_the_job() -> None:
    calls: list[dict[str, Any]] = []

    class FakeCore:
        def list_namespaced_pod(self, namespace: str, **kw: Any) -> _Resp:
            calls.append(kw)
            return _Resp({"metadata": {}, "items": [{"metadata": {"name": "p"}}]})

    cache = WatchCache(required=MANAGED, resync_s=60)
    k = Kube(api=object(), job_cache=cache)  # type: ignore[arg-type]
    k.__dict__["core"] = FakeCore()
    cache.observe("MODIFIED", job("j", rv=42, done=True))
    assert k.list_pods("ns", "batch.kubernetes.io/job-name=j")[0]["metadata"]["name"] == "p"
    assert calls[-1]["resource_version"] == "42" and calls[-1]["resource_version_match"] == "NotOlderThan"
    k.list_pods("ns", "batch.kubernetes.io/job-name=unknown")
    k.list_pods("ns", "app=x")
    assert all("resource_version" not in c for c in calls[1:])


def trial_pod(job_uid: str, phase: str = "Succeeded", exit_code: int | None = 0, ns: str = "ns",
              disrupted: bool = False) -> dict[str, Any]:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    conditions = [{"type": "DisruptionTarget", "status": "True"}] if disrupted else []
    return {"metadata": {"name": f"pod-{job_uid}", "namespace": ns, "labels": {BATCH_LABEL: "true"},
                         "ownerReferences": [{"kind": "Job", "name": "j", "uid": job_uid}]},
            "status": {"phase": phase, "conditions": conditions,
                       "containerStatuses": [{"name": "trial", "state": state}]}}


def test_ended_pods_hold_decisive_ends_by_job_uid_until_their_job_is_deleted() -> None:
    ended = EndedPods()
    k = Kube(api=object(), ended_pods=ended)  # type: ignore[arg-type]
    the_job = job("j", uid="u1")
    assert not ended.observe("MODIFIED", trial_pod("u1", "Running", None))  # still running
    assert not ended.observe("MODIFIED", trial_pod("u1", "Failed", 137, disrupted=True))  # the Job starts another
    assert k.ended_pod("ns", the_job) is None
    assert ended.observe("MODIFIED", trial_pod("u1"))  # wakes the run once...
    assert not ended.observe("MODIFIED", trial_pod("u1"))  # ...not again
    assert k.ended_pod("ns", the_job) is not None
    # A re-created Job of the same name is another uid: the old Pod says nothing about it.
    assert k.ended_pod("ns", job("j", uid="u2")) is None
    assert k.ended_pod("other", the_job) is None
    # The Pod deleted: its end is still the Job's verdict, read until the Job goes.
    assert not ended.observe("DELETED", trial_pod("u1"))
    assert k.ended_pod("ns", the_job) is not None
    ended.job_deleted("ns", "u1")
    assert k.ended_pod("ns", the_job) is None and len(ended) == 0
    # The garbage collector deletes the Pods after their Job: their last events add nothing.
    assert not ended.observe("MODIFIED", trial_pod("u1")) and not ended.observe("DELETED", trial_pod("u1"))
    assert len(ended) == 0
    # kopf's initial listing after a restart, and a Pod seen first as deleted (its last state).
    assert ended.observe(None, trial_pod("u4")) and ended.observe("DELETED", trial_pod("u5"))
    # Pods that belong to no Job are not trials.
    orphan = trial_pod("u3")
    orphan["metadata"]["ownerReferences"] = []
    assert not ended.observe("MODIFIED", orphan) and len(ended) == 2
    assert Kube(api=object()).ended_pod("ns", the_job) is None  # type: ignore[arg-type]


def test_any_end_of_a_trial_pod_but_a_disruption_is_final_and_kept_after_the_pod_is_deleted() -> None:
    ended = EndedPods()
    # Deleted mid-batch: the job wrote what it finished and exited 20 (SIGTERM) or was
    # killed (137). Its Job (backoffLimit 0) is never retried, so that end is the verdict.
    assert not ended.observe("MODIFIED", trial_pod("b1", "Running", None))
    assert ended.observe("MODIFIED", trial_pod("b1", "Failed", 20))
    assert not ended.observe("DELETED", trial_pod("b1", "Failed", 20))
    assert ended.get("ns", "b1") is not None
    assert ended.observe("DELETED", trial_pod("b2", "Failed", 137))  # only its deletion was seen
    # Evicted, preempted, its node drained: its Job's pod failure policy starts another Pod.
    assert not ended.observe("DELETED", trial_pod("s1", "Failed", 137, disrupted=True))


def _running_batch(phase: str = "Running", running: bool = True, batch: bool = True) -> dict[str, Any]:
    state = {"running": {"startedAt": "2026-01-01T00:00:00Z"}} if running else {"waiting": {"reason": "x"}}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "pod-1",
                         "labels": {BATCH_LABEL: "true"} if batch else {}},
            "status": {"phase": phase, "containerStatuses": [{"name": "trial", "state": state}]}}


def test_only_a_running_batch_pods_log_carries_answers() -> None:
    assert answers_in_log(_running_batch())
    assert not answers_in_log(_running_batch(batch=False))  # a Job of an earlier version: its end is its answer
    assert not answers_in_log(_running_batch(phase="Pending", running=False))
    assert not answers_in_log(_running_batch(running=False))


def test_streamed_answers_are_kept_once_per_index_and_leave_with_their_job() -> None:
    streamed = StreamedAnswers()
    first = Answer.of(3, TrialResult(outcome=Outcome.OK, objective=1.0, times=[1.0]))
    again = Answer.of(3, TrialResult(outcome=Outcome.OK, objective=2.0, times=[2.0]))
    assert streamed.claim("pod-1", "ns", "job-uid") and not streamed.claim("pod-1", "ns", "job-uid")
    assert streamed.add("ns", "job-uid", first) and not streamed.add("ns", "job-uid", again)
    assert streamed.of("ns", "job-uid") == {3: first} and streamed.of("other", "job-uid") == {}
    assert streamed.wanted("ns", "job-uid")
    streamed.job_deleted("ns", "job-uid")
    # A line read after the deletion (in flight) does not bring the Job back; nor does a late Pod.
    assert not streamed.add("ns", "job-uid", first) and streamed.of("ns", "job-uid") == {}
    assert not streamed.wanted("ns", "job-uid") and not streamed.claim("pod-2", "ns", "job-uid")
