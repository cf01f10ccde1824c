"""Pure logic behind what broke in the first hour of real use: bounded text
and names, the trial policy, publishing only into the run's own ConfigMap, results shards
unique per run with bounded conflicts, a status that always fits, integer ranges."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from fleettune.admission import (
    AdmissionError,
    OperatorConfigError,
    TrialPolicy,
    check_node_selectors,
    check_trial_policy,
    normalize,
)
from fleettune.api import TuningRunSpec
from fleettune.labels import RESULTS_OF_LABEL
from fleettune.names import INT64_MAX, bounded, child_name, label_value
from fleettune.published import PUBLISHED_BY, PUBLISHED_BY_RUN, not_ours, published_configmap
from fleettune.results import TrialRecord
from fleettune.rollup import fit_status, run_status, status_budget, target_status
from fleettune.store import ResultsStore, StoreConflict, encode_shard, shard_name
from fleettune_job.protocol import Outcome

LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


# ---------------------------------------------------------------------------- bounding


@pytest.mark.parametrize("n", [0, 10, 1000, 1001, 5000, 1_500_000])
def test_bounded_text_never_exceeds_its_limit_and_says_what_was_cut(n: int) -> None:
    text = "x" * n
    out = bounded(text)
    assert len(out) <= 1000
    if n <= 1000:
        assert out == text
    else:
        cut = int(re.search(r"\((\d+) more characters\)$", out).group(1))
        assert out.startswith("x") and len(out) - len(out.split("…")[1]) - 1 + cut == n
    assert len(bounded(text, 40)) <= 40


@pytest.mark.parametrize("name", ["conv", "a" * 63, "a" * 64, "b" * 253, "a." * 100 + "z", "x-" * 40 + "y"])
def test_label_values_are_valid_and_stand_for_the_whole_name(name: str) -> None:
    value = label_value(name)
    assert len(value) <= 63 and LABEL_VALUE.fullmatch(value), value
    if len(name) <= 63:
        assert value == name
    assert label_value(name + "1") != label_value(name + "2")


def test_child_names_are_unique_per_uid_and_valid_dns_names() -> None:
    run = "a" * 250
    names = {child_name(run, uid, "results-0000") for uid in ("u1", "u2")}
    assert len(names) == 2
    for name in names:
        assert len(name) <= 253 and DNS_SUBDOMAIN.fullmatch(name)
    # The case from the issue: names sharing their first 40 characters.
    a, b = "t" * 40 + "-first", "t" * 40 + "-second"
    assert shard_name(a, "uid-a", 0) != shard_name(b, "uid-b", 0)
    assert shard_name("conv", "uid", 3).startswith("conv-") and shard_name("conv", "uid", 3).endswith("-results-0003")


# ---------------------------------------------------------------------------- trial policy


def _spec(**target: Any) -> TuningRunSpec:
    return TuningRunSpec.model_validate({
        "kernel": {"builtin": "convolution", "problemSize": [64, 64]},
        "parameters": [{"name": "x", "values": [1, 2]}],
        "targets": [{"name": "a", "nodeSelector": {"pool": "a"}}, {"name": "b", **target}],
    })


POLICY = TrialPolicy.from_env({"FLEETTUNE_JOB_IMAGE": "ghcr.io/fleettune/job:0.1.0"})


def test_privileged_trials_are_refused_unless_the_operator_enables_them() -> None:
    spec = _spec(allowPrivileged=True)
    with pytest.raises(AdmissionError) as err:
        check_trial_policy(spec, POLICY)
    assert str(err.value).startswith("spec.targets[1].allowPrivileged:") and err.value.reason == "Forbidden"
    for value in ("", "false", "0", "flase", "TRUE please"):  # a typo never opens the door
        assert not TrialPolicy.from_env({"FLEETTUNE_ALLOW_PRIVILEGED_TRIALS": value}).allow_privileged
    check_trial_policy(spec, TrialPolicy.from_env({"FLEETTUNE_ALLOW_PRIVILEGED_TRIALS": "true"}))


@pytest.mark.parametrize("image, allowed", [
    ("ghcr.io/fleettune/job:0.1.0", True),
    ("ghcr.io/fleettune/job:0.1.0-l4t", True),  # the example's Jetson image
    ("ghcr.io/fleettune/job@sha256:" + "0" * 64, True),
    ("ghcr.io/fleettune/job", True),
    ("ghcr.io/fleettune/job-evil:1", False),
    ("ghcr.io/fleettune/jobs/x:1", False),
    ("docker.io/library/alpine:latest", False),
    ("alpine", False),
    ("evil.io/ghcr.io/fleettune/job:1", False),
])
def test_images_default_to_the_operators_job_image_repository(image: str, allowed: bool) -> None:
    assert POLICY.image_allowed(image) is allowed
    spec = _spec(image=image)
    if allowed:
        check_trial_policy(spec, POLICY)
    else:
        with pytest.raises(AdmissionError, match=r"^spec\.targets\[1\]\.image: "):
            check_trial_policy(spec, POLICY)


def test_the_allow_list_takes_repositories_registries_and_globs() -> None:
    allowed = " alpine , registry.local:5000/team/, ghcr.io/acme/*:v1*"
    policy = TrialPolicy.from_env({"FLEETTUNE_JOB_IMAGE": "ghcr.io/fleettune/job:0.1.0",
                                   "FLEETTUNE_ALLOWED_IMAGES": allowed})
    assert policy.image_allowed("docker.io/library/alpine:3.20") and policy.image_allowed("alpine@sha256:ab")
    assert policy.image_allowed("registry.local:5000/team/kernels/x:1")
    assert not policy.image_allowed("registry.local:5000/other/x:1")
    assert policy.image_allowed("ghcr.io/acme/tuner:v1.2") and not policy.image_allowed("ghcr.io/acme/tuner:v2")
    assert policy.image_allowed("ghcr.io/fleettune/job:0.2.0")  # the operator's own stays allowed
    assert normalize("alpine") == "docker.io/library/alpine" == normalize("index.docker.io/alpine")
    spec = TuningRunSpec.model_validate({**_spec().model_dump(by_alias=True, exclude_none=True),
                                         "jobTemplate": {"image": "quay.io/x/y:1"}})
    with pytest.raises(AdmissionError, match=r"^spec\.jobTemplate\.image: image 'quay.io/x/y:1' is not allowed"):
        check_trial_policy(spec, policy)


def test_node_selectors_a_pod_cannot_carry_are_invalid_specs() -> None:
    huge = _spec(nodeSelector={"fleettune.dev/pool": "x" * 1_500_000})
    with pytest.raises(AdmissionError) as err:
        check_node_selectors(huge)
    assert str(err.value).startswith("spec.targets[1].nodeSelector:") and err.value.reason == "InvalidSpec"
    assert len(str(err.value)) < 400
    with pytest.raises(AdmissionError, match="key"):
        check_node_selectors(_spec(nodeSelector={"bad key": "v"}))
    check_node_selectors(_spec(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB", "k": ""}))



def test_trial_pods_uid_secrets_and_service_account_come_from_the_operators_environment() -> None:
    assert (POLICY.run_as_user, POLICY.image_pull_secrets, POLICY.service_account) == (10001, (), None)
    policy = TrialPolicy.from_env({
        "FLEETTUNE_TRIAL_RUN_AS_USER": " 2000 ",
        "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS": " mirror, team-registry ,,mirror",
        "FLEETTUNE_TRIAL_SERVICE_ACCOUNT": "fleettune-trial",
    })
    assert policy.run_as_user == 2000 and policy.image_pull_secrets == ("mirror", "team-registry")
    assert policy.service_account == "fleettune-trial"
    # Empty: the platform assigns the UID (OpenShift restricted-v2); unset: the default.
    assert TrialPolicy.from_env({"FLEETTUNE_TRIAL_RUN_AS_USER": ""}).run_as_user is None
    assert TrialPolicy.from_env({}).run_as_user == 10001


@pytest.mark.parametrize("env, variable", [
    ({"FLEETTUNE_TRIAL_RUN_AS_USER": "0"}, "FLEETTUNE_TRIAL_RUN_AS_USER='0'"),  # root, yet runAsNonRoot
    ({"FLEETTUNE_TRIAL_RUN_AS_USER": "-1"}, "FLEETTUNE_TRIAL_RUN_AS_USER='-1'"),
    ({"FLEETTUNE_TRIAL_RUN_AS_USER": "1e4"}, "FLEETTUNE_TRIAL_RUN_AS_USER='1e4'"),
    ({"FLEETTUNE_TRIAL_RUN_AS_USER": "nobody"}, "FLEETTUNE_TRIAL_RUN_AS_USER='nobody'"),
    ({"FLEETTUNE_TRIAL_RUN_AS_USER": "2147483648"}, "FLEETTUNE_TRIAL_RUN_AS_USER='2147483648'"),
    ({"FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS": "ok,Not_A_Name"}, "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS: 'Not_A_Name'"),
    ({"FLEETTUNE_TRIAL_SERVICE_ACCOUNT": "a,b"}, "FLEETTUNE_TRIAL_SERVICE_ACCOUNT: one ServiceAccount name"),
])
def test_a_value_the_operator_cannot_read_is_an_error_naming_the_variable(env: dict[str, str],
                                                                          variable: str) -> None:
    with pytest.raises(OperatorConfigError) as err:
        TrialPolicy.from_env(env)
    assert str(err.value).startswith(f"the operator's configuration: {variable}"), str(err.value)
    # The planner reports an AdmissionError in the run's Ready condition, with its reason.
    assert isinstance(err.value, AdmissionError) and err.value.reason == "InvalidOperatorConfig"


def test_every_unreadable_value_is_named_at_once() -> None:
    with pytest.raises(OperatorConfigError) as err:
        TrialPolicy.from_env({"FLEETTUNE_TRIAL_RUN_AS_USER": "x", "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS": "A"})
    assert "FLEETTUNE_TRIAL_RUN_AS_USER" in str(err.value) and "FLEETTUNE_TRIAL_IMAGE_PULL_SECRETS" in str(err.value)


def _with_account(account: str) -> TuningRunSpec:
    return TuningRunSpec.model_validate({**_spec().model_dump(by_alias=True, exclude_none=True),
                                         "jobTemplate": {"serviceAccountName": account}})


def test_a_runs_own_service_account_needs_the_operators_leave() -> None:
    with pytest.raises(AdmissionError) as err:
        check_trial_policy(_with_account("cluster-admin-ish"), POLICY)
    assert str(err.value).startswith("spec.jobTemplate.serviceAccountName: ServiceAccount 'cluster-admin-ish' is not "
                                     "allowed") and err.value.reason == "Forbidden"
    assert "trialPolicy.allowedServiceAccounts" in str(err.value)
    check_trial_policy(_with_account("default"), POLICY)  # what its Pods get anyway
    own = TrialPolicy.from_env({"FLEETTUNE_TRIAL_SERVICE_ACCOUNT": "fleettune-trial"})
    check_trial_policy(_with_account("fleettune-trial"), own)
    with pytest.raises(AdmissionError, match="allowed: fleettune-trial;"):
        check_trial_policy(_with_account("default"), own)
    listed = TrialPolicy.from_env({"FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS": "gpu-team, tuner-*"})
    check_trial_policy(_with_account("gpu-team"), listed)
    check_trial_policy(_with_account("tuner-a"), listed)
    with pytest.raises(AdmissionError, match=r"allowed: default, gpu-team, tuner-\*;"):
        check_trial_policy(_with_account("gpu-team-2"), listed)
    check_trial_policy(_with_account("anything"), TrialPolicy.from_env({"FLEETTUNE_ALLOWED_SERVICE_ACCOUNTS": "*"}))


# ---------------------------------------------------------------------------- publishing


def test_only_a_configmap_with_the_runs_marks_is_published_into() -> None:
    ours = published_configmap("conv", "ns", "uid-1", [], name="tuned", run_uid="uid-1")["metadata"]
    assert ours["labels"][PUBLISHED_BY] == "conv" and ours["annotations"][PUBLISHED_BY_RUN] == "conv"
    assert not_ours(ours, "conv") is None
    # Retained (no owner) and re-created under the same name: still the run's to update.
    retained = published_configmap("conv", "ns", None, [], name="tuned", run_uid="old-uid")["metadata"]
    assert not_ours(retained, "conv") is None
    # Published by an earlier version: the label alone.
    assert not_ours({"name": "t", "labels": {PUBLISHED_BY: "conv", "app.kubernetes.io/managed-by": "fleettune"}},
                    "conv") is None
    precious = {"name": "precious-config", "labels": {"app": "web"}}
    assert not_ours(precious, "conv") == ("spec.publish.configMapName: ConfigMap precious-config exists and is "
                                          "not published by this run")
    assert not_ours({"name": "x"}, "conv") is not None
    assert not_ours(ours, "other") is not None  # another run's published map
    shard = {"name": "conv-results-0000",
             "labels": {RESULTS_OF_LABEL: "conv", "app.kubernetes.io/managed-by": "fleettune"},
             "ownerReferences": [{"uid": "uid-1"}]}
    assert not_ours(shard, "conv") is not None  # not even the run's own results
    long_run = "r" * 250
    meta = published_configmap(long_run, "ns", None, [], name="t")["metadata"]
    assert len(meta["labels"][PUBLISHED_BY]) <= 63 and not_ours(meta, long_run) is None
    assert not_ours(meta, "r" * 249 + "s") is not None


# ---------------------------------------------------------------------------- results store


def _rec(i: int) -> TrialRecord:
    return TrialRecord(target="a", index=i, config={"x": i}, key=str(i), outcome=Outcome.OK, objective=1.0 + i)


class FakeCore:
    """ConfigMaps in memory, with the apiserver's create/replace semantics."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.calls = 0
        self.rv = 0

    def _answer(self, body: dict[str, Any]) -> SimpleNamespace:
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[body["metadata"]["name"]] = body
        return SimpleNamespace(data=json.dumps(body).encode())

    def create_namespaced_config_map(self, namespace, body, _preload_content=True):
        self.calls += 1
        if body["metadata"]["name"] in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._answer(json.loads(json.dumps(body)))

    def replace_namespaced_config_map(self, name, namespace, body, _preload_content=True):
        self.calls += 1
        old = self.objects.get(name)
        if old is None:
            raise ApiException(status=404, reason="NotFound")
        if old["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise ApiException(status=409, reason="Conflict")
        return self._answer(json.loads(json.dumps(body)))

    def read_namespaced_config_map(self, name, namespace, _preload_content=True):
        self.calls += 1
        if name not in self.objects:
            raise ApiException(status=404, reason="NotFound")
        return SimpleNamespace(data=json.dumps(self.objects[name]).encode())

    def list_namespaced_config_map(self, namespace, label_selector=""):
        self.calls += 1
        key, _, value = label_selector.partition("=")
        items = []
        for o in self.objects.values():
            if (o["metadata"].get("labels") or {}).get(key) == value:
                meta = o["metadata"]
                items.append(SimpleNamespace(
                    metadata=SimpleNamespace(name=meta["name"], resource_version=meta["resourceVersion"],
                                             labels=meta.get("labels"),
                                             owner_references=[SimpleNamespace(uid=r["uid"])
                                                               for r in meta.get("ownerReferences") or []]),
                    binary_data=o.get("binaryData")))
        return SimpleNamespace(items=items)


def test_runs_sharing_a_name_prefix_keep_separate_shards() -> None:
    core = FakeCore()
    a = ResultsStore(core, "ns", "t" * 40 + "-first", "uid-a")
    b = ResultsStore(core, "ns", "t" * 40 + "-second", "uid-b")
    a.append([_rec(0), _rec(1)])
    b.append([_rec(5)])
    assert len(core.objects) == 2
    assert [r.index for r in ResultsStore(core, "ns", a.run, "uid-a").load()] == [0, 1]
    assert [r.index for r in ResultsStore(core, "ns", b.run, "uid-b").load()] == [5]


def test_a_shard_name_held_by_another_object_is_never_written_and_the_next_name_is_used() -> None:
    core = FakeCore()
    store = ResultsStore(core, "ns", "conv", "uid-1")
    squatter = {"metadata": {"name": shard_name("conv", "uid-1", 0), "labels": {"app": "mine"}}, "data": {"k": "v"}}
    core._answer(squatter)
    before = json.dumps(core.objects[squatter["metadata"]["name"]])
    assert store.append([_rec(0)]) == [_rec(0)]
    assert json.dumps(core.objects[squatter["metadata"]["name"]]) == before
    assert shard_name("conv", "uid-1", 1) in core.objects
    assert [r.index for r in ResultsStore(core, "ns", "conv", "uid-1").load()] == [0]
    # Another run of the same name (an older one, not yet garbage-collected) is not read either.
    assert ResultsStore(core, "ns", "conv", "uid-2").load() == []


def test_conflicts_back_off_and_give_up_instead_of_looping(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr("fleettune.store.time.sleep", sleeps.append)

    class AlwaysConflicting(FakeCore):
        def create_namespaced_config_map(self, namespace, body, _preload_content=True):
            self.calls += 1
            raise ApiException(status=409, reason="AlreadyExists")

        def read_namespaced_config_map(self, name, namespace, _preload_content=True):
            self.calls += 1
            return SimpleNamespace(data=json.dumps({"metadata": {"ownerReferences": [{"uid": "uid-1"}]}}).encode())

    core = AlwaysConflicting()
    store = ResultsStore(core, "ns", "conv", "uid-1")
    with pytest.raises(StoreConflict):
        store.append([_rec(0)])
    assert core.calls < 30 and len(sleeps) == ResultsStore.MAX_CONFLICTS
    assert sleeps == sorted(sleeps) and max(sleeps) <= 1.0
    assert (1, "a", 0) not in store  # offered again next time


def test_shards_of_the_earlier_naming_are_still_read_and_filled() -> None:
    core = FakeCore()
    legacy = {"metadata": {"name": "conv-results-0000", "labels": {RESULTS_OF_LABEL: "conv"},
                           "ownerReferences": [{"uid": "uid-1"}]},
              "binaryData": {"records.jsonl.gz": encode_shard([_rec(0)])}}
    core._answer(legacy)
    store = ResultsStore(core, "ns", "conv", "uid-1")
    assert [r.index for r in store.load()] == [0]
    store.append([_rec(1)])
    assert len(core.objects) == 1 and [r.index for r in ResultsStore(core, "ns", "conv", "uid-1").load()] == [0, 1]


def test_records_stored_with_the_earlier_round_key_keep_their_round_in_the_store() -> None:
    # Earlier versions wrote a record's tuning round as "generation".
    import base64
    import gzip

    old = json.loads(_rec(0).model_copy(update={"round": 2}).model_dump_json(exclude_none=True))
    old["generation"] = old.pop("round")
    data = base64.b64encode(gzip.compress((json.dumps(old) + "\n").encode())).decode()
    core = FakeCore()
    core._answer({"metadata": {"name": shard_name("conv", "uid-1", 0), "labels": {RESULTS_OF_LABEL: "conv"},
                               "ownerReferences": [{"uid": "uid-1"}]},
                  "binaryData": {"records.jsonl.gz": data}})
    store = ResultsStore(core, "ns", "conv", "uid-1")
    assert [r.round for r in store.load()] == [2] and (2, "a", 0) in store
    # The same trial recorded again (a restart) is not stored twice; the next round's is.
    assert store.append([_rec(0).model_copy(update={"round": 2})]) == []
    assert [r.round for r in store.append([_rec(0).model_copy(update={"round": 3})])] == [3]
    assert [r.round for r in ResultsStore(core, "ns", "conv", "uid-1").load()] == [2, 3]


# ---------------------------------------------------------------------------- status


def test_target_status_bounds_what_users_control_and_clamps_the_space_size() -> None:
    st = target_status(name="a", phase="Unschedulable", budget=1, records=[], running=0,
                       message="no node matches " + "x" * 1_500_000, stale="s" * 5000, space_size=2**200,
                       device="d" * 5000)
    assert len(st.message) <= 1000 and len(st.stale) <= 1000 and len(st.device) <= 256
    assert st.space_size == INT64_MAX
    status = run_status(previous=None, generation=1, phase="Running", targets=[st], results=None,
                        reason="Tuning", message=st.message)
    assert all(len(c.message) <= 1000 for c in status.conditions)


def test_a_refused_publication_is_a_condition_and_degrades_the_run() -> None:
    st = target_status(name="a", phase="Running", budget=1, records=[], running=1)
    refused = (False, "PublishRefused", "spec.publish.configMapName: ConfigMap x exists and is not published")
    status = run_status(previous=None, generation=1, phase="Running", targets=[st], results=None, reason="Tuning",
                        message="", published=refused)
    cond = {c.type: c for c in status.conditions}
    assert cond["Published"].status == "False" and cond["Published"].message.startswith("spec.publish")
    assert cond["Degraded"].status == "True" and cond["Degraded"].reason == "PublishRefused"
    status = run_status(previous=status, generation=1, phase="Running", targets=[st], results=None, reason="Tuning",
                        message="", published=(False, "NothingYet", "no result to publish yet"))
    assert {c.type: c.status for c in status.conditions}["Degraded"] == "False"
    status = run_status(previous=status, generation=2, phase="Running", targets=[st], results=None, reason="Tuning",
                        message="")
    assert "Published" not in {c.type for c in status.conditions}


def test_a_finished_run_whose_configmap_was_not_written_is_not_ready() -> None:
    """Ready says the run did what its spec asks, publishing included: a tuned run whose
    ConfigMap was refused is Ready=False (the printer column and `kubectl wait` show it)
    and Stalled (kstatus: Failed) until the name is freed."""
    st = target_status(name="a", phase="Succeeded", budget=1, records=[], running=0)
    refused = (False, "PublishRefused", "spec.publish.configMapName: ConfigMap x exists and is not published")

    def conditions(published: tuple[bool, str, str] | None, previous: Any = None) -> Any:
        status = run_status(previous=previous, generation=1, phase="Succeeded", targets=[st], results=None,
                            reason="Tuned", message="", published=published)
        return status, {c.type: c for c in status.conditions}

    status, cond = conditions(refused)
    assert (cond["Ready"].status, cond["Ready"].reason, cond["Ready"].message) == ("False", *refused[1:])
    assert (cond["Stalled"].status, cond["Stalled"].reason) == ("True", "PublishRefused")
    assert cond["Degraded"].status == "True" and cond["Reconciling"].status == "False"
    assert status.phase == "Succeeded"  # the tuning itself did succeed
    # A failed write is retried: not Ready meanwhile, but not Stalled either.
    _, cond = conditions((False, "PublishFailed", "writing ConfigMap x: 500 boom"))
    assert (cond["Ready"].status, cond["Ready"].reason) == ("False", "PublishFailed")
    assert cond["Stalled"].status == "False"
    # Once the name is freed and written, Ready and no longer Stalled.
    _, cond = conditions((True, "Published", ""), previous=status)
    assert (cond["Ready"].status, cond["Ready"].reason) == ("True", "Tuned") and cond["Stalled"].status == "False"
    _, cond = conditions(None)
    assert cond["Ready"].status == "True"  # a run that does not publish


def test_an_operator_restarted_on_an_unpublished_run_does_not_announce_it_tuned_again() -> None:
    import logging

    from fleettune.api import TuningRunStatus
    from fleettune.controller.reporting import Report, Reporter

    st = target_status(name="a", phase="Succeeded", budget=1, records=[], running=0)
    refused = (False, "PublishRefused", "spec.publish.configMapName: ConfigMap x exists and is not published")
    before = run_status(previous=None, generation=1, phase="Succeeded", targets=[st], results=None, reason="Tuned",
                        message="", published=refused)
    reporter = Reporter(logging.getLogger("test"))
    reporter.restore(TuningRunStatus.model_validate(before.model_dump(by_alias=True, mode="json")))
    reporter.status(Report("Succeeded", [st], "Tuned", "", finished=True), previous=before,
                    body={"metadata": {"name": "r", "generation": 1}}, results={"configMapPrefix": "r"},
                    published=refused, published_name="x", extra={})
    assert reporter.take_events() == []


def test_kubectl_shows_why_a_run_is_not_ready() -> None:
    from fleettune.crd import PRINTER_COLUMNS

    paths = {c["name"]: c["jsonPath"] for c in PRINTER_COLUMNS}
    assert paths["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert paths["Reason"] == '.status.conditions[?(@.type=="Ready")].reason'


def test_the_status_is_shrunk_to_fit_beside_a_huge_spec() -> None:
    big = "v" * 200_000
    records = [TrialRecord(target="a", index=i, config={"s": big, "i": i}, key=str(i), outcome=Outcome.OK,
                           objective=1.0 + i) for i in range(6)]
    targets = [target_status(name=f"t{k}", phase="Running", budget=9, records=records, running=0) for k in range(3)]
    status = run_status(previous=None, generation=1, phase="Running", targets=targets, results=None, reason="Tuning",
                        message="").model_dump(by_alias=True, exclude_none=True, mode="json")
    body = {"metadata": {"name": "r"}, "spec": {"targets": [{"nodeSelector": {"k": "x" * 1_400_000}}]}}
    budget = status_budget(body)
    assert 8 * 1024 <= budget < 100_000
    fitted = fit_status(status, budget)
    assert len(json.dumps(fitted)) <= budget
    assert fitted["conditions"] == status["conditions"] and fitted["phase"] == "Running"
    assert fit_status({"phase": "Running"}, budget) == {"phase": "Running"}


def test_retune_tokens_too_long_for_the_status_are_kept_as_hashes() -> None:
    from fleettune.controller.spec import retune_key

    assert retune_key("2025-01-01") == "2025-01-01"
    long = "t" * 100_000
    assert len(retune_key(long)) < 128 and retune_key(long) == retune_key(long) != retune_key(long + "x")


# ---------------------------------------------------------------------------- integer ranges


def test_integer_ranges_from_the_crd_work_and_fractions_are_named() -> None:
    from fleettune.space import SearchSpace, SpaceError

    spec = TuningRunSpec.model_validate({
        "kernel": {"builtin": "convolution", "problemSize": [64, 64]},
        "parameters": [{"name": "x", "type": "integer", "range": {"min": 1, "max": 4}},
                       {"name": "y", "type": "integer", "range": {"min": 0, "max": 8, "step": 4}}],
        "targets": [{"name": "a"}],
    })
    params = [p.dump() for p in spec.parameters]
    assert params[0]["range"] == {"min": 1.0, "max": 4.0}  # what the operator gets: floats
    space = SearchSpace.from_spec(params, [], None)
    assert space.count() == 12
    for bad, field in [({"min": 1.5, "max": 4}, "min"), ({"min": 1, "max": 4.25}, "max"),
                       ({"min": 1, "max": 4, "step": 0.5}, "step")]:
        with pytest.raises(SpaceError) as err:
            SearchSpace.from_spec([{"name": "x", "type": "integer", "range": bad}], [], None)
        assert str(err.value).startswith(f"parameters[0].range.{field}: expected an integer"), str(err.value)
    with pytest.raises(SpaceError, match=r"about 10\^308 values"):
        SearchSpace.from_spec([{"name": "x", "type": "integer", "range": {"min": -1.7e308, "max": 1.7e308}}], [],
                              None)
