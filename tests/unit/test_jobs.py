import copy
from pathlib import Path

import pytest
import yaml

from fleettune.api import TargetSpec, TuningRunSpec
from fleettune.jobs import entries_of, from_earlier_version, job_name, render_job, work_of
from fleettune.labels import BATCH_LABEL, RUN_LABEL, TARGET_LABEL, TRIAL_LABEL
from fleettune_job.protocol import TRIAL_ENV, Batch

ROOT = Path(__file__).resolve().parents[2]
SPEC = TuningRunSpec.model_validate(
    yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"]
)
CONFIG = {"block_size_x": 32, "block_size_y": 4}


def _render(target_index=0, index=7):
    return render_job(
        run="conv", namespace="ns", uid="uid-1", spec=SPEC, target=SPEC.targets[target_index],
        index=index, configs=[(CONFIG, "32,4")],
    )


def test_job_is_owned_labelled_and_named_deterministically():
    job = _render()
    meta = job["metadata"]
    assert meta["name"] == "conv-a100-0007" == _render()["metadata"]["name"]
    assert meta["labels"][RUN_LABEL] == "conv" and meta["labels"][TARGET_LABEL] == "a100"
    assert meta["labels"][TRIAL_LABEL] == "7"
    owner = meta["ownerReferences"][0]
    assert owner["uid"] == "uid-1" and owner["kind"] == "TuningRun" and owner["controller"] is True


def test_long_names_stay_valid_and_distinct():
    names = {job_name("r" * 80, "pool-" + str(i), 12) for i in range(5)}
    assert len(names) == 5 and all(len(n) <= 63 and not n.endswith("-") for n in names)


def test_job_spec_follows_the_trial_contract():
    job = _render()
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] > SPEC.budget.trial_timeout_seconds
    # One configuration is a batch of one: never retried by the Job controller (an invalid
    # configuration is an answer, costs no retry), but a disruption is no failure.
    assert spec["backoffLimit"] == 0
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    assert job["metadata"]["labels"][BATCH_LABEL] == "true" == spec["template"]["metadata"]["labels"][BATCH_LABEL]
    assert not from_earlier_version(job)
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB"}
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    batch = Batch.from_env(env[TRIAL_ENV])
    assert [(e.index, e.config) for e in batch.entries] == [(7, CONFIG)] and batch.kernel.builtin == "convolution"


def test_pods_are_non_root_read_only_without_escalation():
    pod = _render()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    sc = pod["containers"][0]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}


def test_jetson_target_gets_runtime_class_tolerations_and_its_image():
    pod = _render(target_index=2)["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["tolerations"][0]["key"] == "edge"
    assert pod["containers"][0]["image"].endswith("-l4t")


def test_a_target_may_opt_out_of_the_restricted_context_only_where_the_operator_allows_it(monkeypatch):
    target = SPEC.targets[0].model_copy(update={"allow_privileged": True})

    def container():
        job = render_job(run="c", namespace="n", uid="u", spec=SPEC, target=target, index=0, configs=[({}, "")])
        return job["spec"]["template"]["spec"]["containers"][0]

    monkeypatch.setenv("FLEETTUNE_ALLOW_PRIVILEGED_TRIALS", "true")
    assert container()["securityContext"] == {}
    # The run is refused before any Job is rendered; should one be rendered anyway, it is restricted.
    monkeypatch.delenv("FLEETTUNE_ALLOW_PRIVILEGED_TRIALS")
    assert container()["securityContext"]["privileged"] is False


def test_long_run_names_give_valid_unique_labels_and_job_names():
    import re

    from fleettune.jobs import run_label, run_selector

    long_a, long_b = "r" * 200 + "a", "r" * 200 + "b"
    for run in (long_a, long_b, "x" * 63, "a." * 40 + "z"):
        meta = render_job(run=run, namespace="n", uid="u", spec=SPEC, target=SPEC.targets[0], index=12345,
                          configs=[({}, "")])["metadata"]
        label = meta["labels"][RUN_LABEL]
        assert label == run_label(run) and len(label) <= 63
        assert re.fullmatch(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", label)
        assert len(meta["name"]) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", meta["name"])
        assert ".-" not in meta["name"] and meta["name"].endswith("-12345")
        assert run_selector(run).endswith(f"={label}")
    assert run_label(long_a) != run_label(long_b)
    assert job_name(long_a, "a100", 1) != job_name(long_b, "a100", 1)
    assert run_label("conv") == "conv"  # short names read (and select) as before
    several = "t" * 24 + ".2147483647x2147483647x2147483647"
    assert job_name("r" * 60, several, 3) != job_name("r" * 60, several, 4)


def test_one_size_of_several_is_labelled_named_and_sent_with_its_size():
    from fleettune.sizes import pool_key, target_of_key

    key = pool_key("a100", (2048, 2048), several=True)
    assert key == "a100.2048x2048" and target_of_key(key) == "a100"
    assert pool_key("a100", (2048, 2048), several=False) == "a100" == target_of_key("a100")
    job = render_job(
        run="conv", namespace="ns", uid="uid-1", spec=SPEC, target=SPEC.targets[0], index=3,
        configs=[(CONFIG, "32,4")], key=key, problem_size=(2048, 2048),
    )
    assert job["metadata"]["name"] == "conv-a100.2048x2048-0003"
    assert job["metadata"]["labels"][TARGET_LABEL] == key == job["spec"]["template"]["metadata"]["labels"][TARGET_LABEL]
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    batch = Batch.from_env(next(e["value"] for e in env if e["name"] == TRIAL_ENV))
    assert batch.target == key and batch.problem_size == [2048, 2048]
    # Without a size, the kernel's own.
    assert work_of(_render()).problem_size == SPEC.kernel.problem_size


def _pod(target=None, spec=SPEC, policy=None):
    job = render_job(run="c", namespace="n", uid="u", spec=spec, target=target or spec.targets[0], index=0,
                     configs=[({}, "")], policy=policy)
    return job["spec"]["template"]["spec"]


def test_trial_pods_run_as_the_policys_uid_or_as_the_platform_assigns(monkeypatch):
    from fleettune.admission import TrialPolicy

    restricted = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "privileged": False,
                  "capabilities": {"drop": ["ALL"]}}
    monkeypatch.delenv("FLEETTUNE_TRIAL_RUN_AS_USER", raising=False)
    pod = _pod()
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                      "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    pod = _pod(policy=TrialPolicy(run_as_user=2000))
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"],
            pod["securityContext"]["fsGroup"]) == (2000, 2000, 2000)
    # Empty (the chart's `trialPolicy.runAsUser: null`): OpenShift's restricted-v2 assigns them;
    # the Pod is as restricted as ever.
    monkeypatch.setenv("FLEETTUNE_TRIAL_RUN_AS_USER", "")
    for pod in (_pod(), _pod(policy=TrialPolicy(run_as_user=None))):
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["containers"][0]["securityContext"] == restricted
        assert pod["automountServiceAccountToken"] is False


def _with_template(**template):
    doc = SPEC.model_dump(by_alias=True, exclude_none=True)
    doc["jobTemplate"] = {**doc.get("jobTemplate", {}), **template}
    return TuningRunSpec.model_validate(doc)


def test_image_pull_secrets_come_from_the_operator_the_run_and_the_pool():
    from fleettune.admission import TrialPolicy

    assert "imagePullSecrets" not in _pod(policy=TrialPolicy())
    policy = TrialPolicy(image_pull_secrets=("mirror",))
    assert _pod(policy=policy)["imagePullSecrets"] == [{"name": "mirror"}]
    spec = _with_template(imagePullSecrets=[{"name": "team"}, {"name": "mirror"}])
    arm = TargetSpec.model_validate({**spec.targets[2].dump(), "imagePullSecrets": [{"name": "arm-registry"}]})
    assert _pod(arm, spec, policy)["imagePullSecrets"] == [
        {"name": "mirror"}, {"name": "team"}, {"name": "arm-registry"}]
    assert _pod(spec.targets[0], spec, policy)["imagePullSecrets"] == [{"name": "mirror"}, {"name": "team"}]


def test_the_service_account_is_the_runs_or_the_operators_and_its_token_is_never_mounted():
    from fleettune.admission import TrialPolicy

    pod = _pod(policy=TrialPolicy())
    assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
    pod = _pod(policy=TrialPolicy(service_account="fleettune-trial"))
    assert pod["serviceAccountName"] == "fleettune-trial" and pod["automountServiceAccountToken"] is False
    pod = _pod(spec=_with_template(serviceAccountName="gpu-team"),
               policy=TrialPolicy(service_account="fleettune-trial"))
    assert pod["serviceAccountName"] == "gpu-team" and pod["automountServiceAccountToken"] is False


def test_affinity_and_tolerations_reach_the_pod_as_written():
    doc = SPEC.model_dump(by_alias=True, exclude_none=True)
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    affinity = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}
    doc["targets"][0] |= {"tolerations": tolerations, "affinity": affinity}
    spec = TuningRunSpec.model_validate(doc)
    pod = _pod(spec.targets[0], spec)
    assert pod["tolerations"] == tolerations and pod["affinity"] == affinity


def test_a_batch_job_carries_its_trials_and_is_never_retried_by_the_job_controller():
    import json

    from fleettune.labels import CONFIG_KEYS_ANNOTATION

    spec = SPEC
    configs = [{"block_size_x": 16 * (n + 1)} for n in range(3)]
    job = render_job(run="conv", namespace="ns", uid="u", spec=spec, target=spec.targets[0], index=7,
                     configs=[(configs[0], "k0"), (configs[1], "k1"), (configs[2], "k2")])
    assert entries_of(job) == [(7, configs[0]), (8, configs[1]), (9, configs[2])]
    assert job["metadata"]["labels"][TRIAL_LABEL] == "7"
    assert json.loads(job["metadata"]["annotations"][CONFIG_KEYS_ANNOTATION]) == ["k0", "k1", "k2"]
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["podFailurePolicy"] == _render()["spec"]["podFailurePolicy"]
    assert job["spec"]["activeDeadlineSeconds"] == 4 * spec.budget.trial_timeout_seconds + 120
    assert _render()["spec"]["activeDeadlineSeconds"] == 2 * spec.budget.trial_timeout_seconds + 120
    with pytest.raises(ValueError, match="at least one configuration"):
        render_job(run="conv", namespace="ns", uid="u", spec=spec, target=spec.targets[0], index=7, configs=[])
    env = job["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]
    assert Batch.model_validate_json(env).timeout_s == spec.budget.trial_timeout_seconds


def test_the_queue_is_the_targets_the_runs_or_the_operators_default_and_a_bad_default_is_refused():
    import pytest

    from fleettune.admission import OperatorConfigError, TrialPolicy
    from fleettune.labels import QUEUE_NAME_LABEL

    def queue_of(spec, target, policy):
        job = render_job(run="conv", namespace="ns", uid="u", spec=spec, target=target, index=0,
                         configs=[(CONFIG, "k")], policy=policy)
        return job["metadata"]["labels"].get(QUEUE_NAME_LABEL), job["spec"].get("suspend")

    doc = SPEC.model_dump(by_alias=True, exclude_none=True)
    plain, default = TrialPolicy(), TrialPolicy(default_queue="team-gpus")
    assert queue_of(SPEC, SPEC.targets[0], plain) == (None, None)
    assert queue_of(SPEC, SPEC.targets[0], default) == ("team-gpus", True)
    run = TuningRunSpec.model_validate({**doc, "queue": {"name": "tuning"}})
    assert queue_of(run, run.targets[0], default) == ("tuning", True)
    edge = TargetSpec.model_validate({**run.targets[0].dump(), "queue": {"name": "jetson-cluster"}})
    assert queue_of(run, edge, default) == ("jetson-cluster", True)

    assert TrialPolicy.from_env({"FLEETTUNE_DEFAULT_QUEUE": " team-gpus "}).default_queue == "team-gpus"
    with pytest.raises(OperatorConfigError, match=r"FLEETTUNE_DEFAULT_QUEUE='Team_GPUs'.*trialPolicy\.queue"):
        TrialPolicy.from_env({"FLEETTUNE_DEFAULT_QUEUE": "Team_GPUs"})


def test_a_jobs_work_is_read_back_as_rendered_and_parsed_once():
    body = _render(index=7)
    first = work_of(body)
    assert [(e.index, e.config) for e in first.entries] == [(7, CONFIG)]
    assert work_of(copy.deepcopy(body)) is first  # the same text: not parsed again


def test_a_one_configuration_job_of_an_earlier_version_is_told_and_its_configuration_read():
    # As the operator rendered a Job of one configuration before every Job was a batch: a
    # `Trial` document, no batch label. Still running after an upgrade, it is deleted and its
    # configuration measured again (`controller.plan`): it must be readable for that.
    old = _render(index=5)
    trial = Batch.from_env(old["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]).trials()[0]
    old["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = trial.model_dump_json(exclude_none=True)
    for labels in (old["metadata"]["labels"], old["spec"]["template"]["metadata"]["labels"]):
        del labels[BATCH_LABEL]
    assert from_earlier_version(old)
    assert entries_of(old) == [(5, CONFIG)]


@pytest.mark.parametrize(("factor", "best_ms", "expected"), [
    (2.0, 1.5, 3.0), (1.0, 1.5, 1.5), (0.0, 1.5, None), (2.0, None, None), (2.0, 0.0, None),
    (0.5, 1.5, 1.5),  # under 1 (the CRD rejects it): never a cut-off below the best
])
def test_the_pruning_cut_off_is_never_below_the_best(factor: float, best_ms: float | None,
                                                     expected: float | None) -> None:
    from fleettune.jobs import prune_above_ms

    assert prune_above_ms(factor, best_ms) == expected
