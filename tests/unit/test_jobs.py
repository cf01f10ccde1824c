from pathlib import Path

import yaml

from fleettune.api import TuningRunSpec
from fleettune.jobs import job_name, render_job
from fleettune.labels import RUN_LABEL, TARGET_LABEL, TRIAL_LABEL
from fleettune_job.protocol import INVALID_CONFIG_EXIT_CODES, TRIAL_ENV, Trial

ROOT = Path(__file__).resolve().parents[2]
SPEC = TuningRunSpec.model_validate(
    yaml.safe_load((ROOT / "examples" / "convolution-fleet.yaml").read_text())["spec"]
)
CONFIG = {"block_size_x": 32, "block_size_y": 4}


def _render(target_index=0, index=7):
    return render_job(
        run="conv", namespace="ns", uid="uid-1", spec=SPEC, target=SPEC.targets[target_index],
        index=index, config=CONFIG, config_key="32,4",
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
    spec = _render()["spec"]
    assert spec["activeDeadlineSeconds"] > SPEC.budget.trial_timeout_seconds
    assert spec["backoffLimit"] == SPEC.job_template.backoff_limit
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob" and rules[0]["onExitCodes"]["values"] == INVALID_CONFIG_EXIT_CODES
    assert rules[1] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-PCIE-40GB"}
    container = pod["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    trial = Trial.from_env(env[TRIAL_ENV])
    assert trial.config == CONFIG and trial.index == 7 and trial.kernel.builtin == "convolution"


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
        job = render_job(run="c", namespace="n", uid="u", spec=SPEC, target=target, index=0, config={},
                         config_key="")
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
                          config={}, config_key="")["metadata"]
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
        run="conv", namespace="ns", uid="uid-1", spec=SPEC, target=SPEC.targets[0], index=3, config=CONFIG,
        config_key="32,4", key=key, problem_size=(2048, 2048),
    )
    assert job["metadata"]["name"] == "conv-a100.2048x2048-0003"
    assert job["metadata"]["labels"][TARGET_LABEL] == key == job["spec"]["template"]["metadata"]["labels"][TARGET_LABEL]
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    trial = Trial.from_env(next(e["value"] for e in env if e["name"] == TRIAL_ENV))
    assert trial.target == key and trial.problem_size == [2048, 2048]
    # Without a size, the kernel's own.
    assert Trial.from_env(next(e["value"] for e in _render()["spec"]["template"]["spec"]["containers"][0]["env"]
                               if e["name"] == TRIAL_ENV)).problem_size == SPEC.kernel.problem_size
