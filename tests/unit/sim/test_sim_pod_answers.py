"""What the simulator answers for a Pod, before any API call (no cluster needed)."""

from __future__ import annotations

from one_config import batch_env, only

from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_job.protocol import EXIT_STOPPED_EARLY, TRIAL_ENV, Outcome, Trial

FLEET = default_fleet()
CONFIG = {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 1, "tile_size_y": 3, "read_only": 1,
          "use_padding": 0, "use_shmem": 1}


def _pod(env: str | None, container: str = "trial") -> dict:
    envs = [{"name": TRIAL_ENV, "value": env}] if env is not None else []
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {"nodeName": "a100-0", "containers": [
            {"name": "sidecar", "image": "s"}, {"name": container, "image": "t", "env": envs}]},
    }


def _trial(**kw) -> str:
    base = {"run": "r", "target": "a100", "index": 3, "kernel": {"builtin": "convolution"}, "config": CONFIG,
            "problem_size": [4096, 4096]}
    return batch_env(Trial.model_validate(base | kw))


def _sim() -> FleetSimulator:
    return FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0)


def test_a_recorded_trial_is_answered_from_the_pool_recording():
    ans = only(_sim().answer(_pod(_trial()), FLEET.pool("a100").node_labels("a100-0")))
    assert ans.result.outcome == Outcome.OK and ans.result.objective == 0.5536
    assert not ans.result.fingerprint.synthetic


def test_the_same_trial_on_the_jetson_pool_is_synthetic():
    ans = only(_sim().answer(_pod(_trial()), FLEET.pool("jetson-orin").node_labels("jetson-orin-0")))
    assert ans.result.outcome == Outcome.OK and ans.result.fingerprint.synthetic
    assert ans.result.objective > 0.5536 * 2


def test_unanswerable_pods_get_infra_errors_that_say_why():
    sim = _sim()
    labels = FLEET.pool("a100").node_labels("a100-0")
    cases = {
        "no FLEETTUNE_TRIAL": sim.answer(_pod(None), labels),
        "invalid FLEETTUNE_TRIAL": sim.answer(_pod("{"), labels),
        "no pool of the fleet": sim.answer(_pod(_trial()), {"fleettune.dev/pool": "h100"}),
        "neither a built-in kernel nor a source_path": sim.answer(_pod(_trial(kernel={"function": "f"})), labels),
        "no recording or synthetic model for kernel 'transpose', and it is not a built-in kernel": sim.answer(
            _pod(_trial(kernel={"builtin": "transpose"})), labels),
    }
    for text, ans in cases.items():
        # The Pod stops before its configuration: nothing answered, never an invalid one.
        assert not ans.answers and not ans.result.done, text
        assert ans.result.exit_code == EXIT_STOPPED_EARLY
        assert text in ans.result.error and ans.result.error.startswith("simulator: ")


def test_the_trial_container_is_found_by_name_or_by_its_env():
    sim = _sim()
    labels = FLEET.pool("a100").node_labels("a100-0")
    assert only(sim.answer(_pod(_trial(), container="main"), labels)).result.outcome == Outcome.OK
