"""User-source trials in the simulator: the source found through the Pod's ConfigMap volume,
compiled for real with NVRTC, timed by a synthetic model (no cluster)."""

from __future__ import annotations

import base64
import itertools

import pytest
from one_config import batch_env, only

from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.answer import Answer
from fleettune_dev.sim.usersource import (
    Compiler,
    SourceUnavailable,
    compile_defines,
    config_map_data,
    launch_geometry,
    launch_refused,
    source_location,
    synthetic_measurement,
)
from fleettune_job import nvrtc
from fleettune_job.protocol import TRIAL_ENV, Outcome, Trial

FLEET = default_fleet()
SOURCE = """
extern "C" __global__ void scale(float *x, int n) {
    int i = blockIdx.x * block_size_x * tile + threadIdx.x;
    for (int t = 0; t < tile; t++) {
        if (i + t * block_size_x < n) x[i + t * block_size_x] *= 2.0f;
    }
}
"""
needs_nvrtc = pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc is not installed")


def _trial(config: dict | None = None, **kernel) -> Trial:
    ref = {"source_path": "/etc/fleettune/kernel/scale.cu", "function": "scale",
           "grid": ["cdiv(problem_size[0], block_size_x)"], "block": ["block_size_x"]} | kernel
    return Trial.model_validate({"run": "r", "target": "a100", "index": 0, "kernel": ref,
                                 "config": {"block_size_x": 128, "tile": 2} if config is None else config,
                                 "problem_size": [1 << 20]})


def _pod(trial: Trial, *, config_map: str = "kernels", mount: str = "/etc/fleettune/kernel") -> dict:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "nodeName": "a100-0",
            "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "kernel", "configMap": {"name": config_map}}],
            "containers": [{"name": "trial", "image": "t", "env": [{"name": TRIAL_ENV, "value": batch_env(trial)}],
                            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                                             {"name": "kernel", "mountPath": mount, "readOnly": True}]}],
        },
    }


def _answer(sim: FleetSimulator, pod: dict, labels: dict, **kw) -> Answer:
    return only(sim.answer(pod, labels, **kw))


def _maps(data: dict[str, str] | None, name: str = "kernels"):
    return lambda asked: data if asked == name else None


def _sim() -> FleetSimulator:
    return FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0)


A100_LABELS = FLEET.pool("a100").node_labels("a100-0")


def test_the_source_is_found_through_the_trial_containers_config_map_volume():
    container = {"volumeMounts": [{"name": "a", "mountPath": "/etc"},
                                  {"name": "kernel", "mountPath": "/etc/fleettune/kernel"}]}
    volumes = [{"name": "a", "configMap": {"name": "wrong"}}, {"name": "kernel", "configMap": {"name": "src"}}]
    assert source_location(container, volumes, "/etc/fleettune/kernel/k.cu") == ("src", "k.cu")
    projected = [{"name": "kernel", "configMap": {"name": "src", "items": [{"key": "main", "path": "k.cu"}]}}]
    assert source_location(container, projected, "/etc/fleettune/kernel/k.cu") == ("src", "main")
    sub = {"volumeMounts": [{"name": "kernel", "mountPath": "/k.cu", "subPath": "kernel.cu"}]}
    assert source_location(sub, volumes, "/k.cu") == ("src", "kernel.cu")
    with pytest.raises(SourceUnavailable, match="no volume"):
        source_location(container, volumes, "/opt/k.cu")
    with pytest.raises(SourceUnavailable, match="not a ConfigMap"):
        source_location(container, [{"name": "kernel", "emptyDir": {}}], "/etc/fleettune/kernel/k.cu")
    with pytest.raises(SourceUnavailable, match="projects no key"):
        source_location(container, projected, "/etc/fleettune/kernel/other.cu")


def test_binary_config_map_keys_are_read_as_files():
    doc = {"data": {"a": "x"}, "binaryData": {"b": base64.b64encode(b"__global__").decode()}}
    assert config_map_data(doc) == {"a": "x", "b": "__global__"}


def test_the_defines_are_the_jobs():
    assert compile_defines(_trial({"block_size_x": 64, "tile": True, "vec": "float4"})) == {
        "block_size_x": "64", "problem_size_0": "1048576", "tile": "1", "vec": "float4"}
    # Source implementing a built-in's interface also gets that interface's defines.
    conv = compile_defines(_trial({"block_size_x": 16}, builtin="convolution").model_copy(
        update={"problem_size": [4096, 2048]}))
    assert {"image_width": "4096", "image_height": "2048", "block_size_x": "16",
            "problem_size_1": "2048"}.items() <= conv.items()
    with pytest.raises(ValueError, match="compile-time constant"):
        compile_defines(_trial({"x": "1; int y"}))


def test_the_synthetic_model_is_deterministic_smooth_and_marked():
    a = synthetic_measurement(SOURCE, _trial(), "A100/8.0")
    assert a == synthetic_measurement(SOURCE, _trial(), "A100/8.0")
    assert a.synthetic and a.time_ms and len(a.times) == 7
    times = [synthetic_measurement(SOURCE, _trial({"block_size_x": b, "tile": 2}), "A100/8.0").time_ms
             for b in (32, 64, 128, 256, 512, 1024)]
    assert len(set(times)) == len(times)
    # Neighbouring values differ by a bounded factor: a landscape, not noise.
    assert all(0.5 < t1 / t0 < 2 for t0, t1 in itertools.pairwise(times))
    assert synthetic_measurement(SOURCE, _trial(), "Orin/8.7").time_ms != a.time_ms
    assert synthetic_measurement(SOURCE + "\n", _trial(), "A100/8.0").time_ms != a.time_ms


@needs_nvrtc
def test_a_user_kernel_that_compiles_gets_a_synthetic_time():
    sim = _sim()
    ans = _answer(sim, _pod(_trial()), A100_LABELS, config_maps=_maps({"scale.cu": SOURCE}))
    r = ans.result
    assert r.outcome == Outcome.OK, r.error
    assert r.objective and r.fingerprint.synthetic and r.fingerprint.simulated
    assert r.fingerprint.compute_capability == "8.0"
    again = _answer(sim, _pod(_trial()), A100_LABELS, config_maps=_maps({"scale.cu": SOURCE}))
    assert again.result == r
    assert sim.compiler.compiles == 1, "the same configuration on the same architecture compiles once"
    jetson = _answer(sim, _pod(_trial()), FLEET.pool("jetson-orin").node_labels("jetson-orin-0"),
                        config_maps=_maps({"scale.cu": SOURCE}))
    assert jetson.result.outcome == Outcome.OK and jetson.result.fingerprint.compute_capability == "8.7"
    assert sim.compiler.compiles == 2


@needs_nvrtc
def test_compile_errors_are_the_compilers_own():
    sim = _sim()
    missing = _answer(sim, _pod(_trial({"block_size_x": 128})), A100_LABELS, config_maps=_maps({"scale.cu": SOURCE}))
    assert missing.result.outcome == Outcome.COMPILE_ERROR
    assert 'identifier "tile" is undefined' in missing.result.error
    assert not missing.result.fingerprint.synthetic
    wrong_name = _answer(sim, _pod(_trial(function="scal")), A100_LABELS, config_maps=_maps({"scale.cu": SOURCE}))
    assert wrong_name.result.outcome == Outcome.COMPILE_ERROR and "no kernel named 'scal'" in wrong_name.result.error
    injected = _answer(sim, _pod(_trial({"block_size_x": 128, "tile": "1 -o /x"})), A100_LABELS,
                          config_maps=_maps({"scale.cu": SOURCE}))
    assert injected.result.outcome == Outcome.COMPILE_ERROR and "compile-time constant" in injected.result.error


def test_unreadable_source_is_an_infrastructure_error_that_says_why(monkeypatch):
    sim = _sim()
    cases = {
        "ConfigMap kernels not found": _answer(sim, _pod(_trial()), A100_LABELS, config_maps=_maps(None)),
        "has no key 'scale.cu'": _answer(sim, _pod(_trial()), A100_LABELS, config_maps=_maps({"other.cu": SOURCE})),
        "no volume of the trial container": _answer(sim, _pod(_trial(), mount="/opt"), A100_LABELS,
                                                        config_maps=_maps({"scale.cu": SOURCE})),
        "HTTP 500": _answer(sim, _pod(_trial()), A100_LABELS,
                               config_maps=lambda name: (_ for _ in ()).throw(RuntimeError("HTTP 500"))),
    }
    monkeypatch.setattr(Compiler, "available", staticmethod(lambda: False))
    cases["libnvrtc not found"] = _answer(sim, _pod(_trial()), A100_LABELS, config_maps=_maps({"scale.cu": SOURCE}))
    for text, ans in cases.items():
        assert ans.result.outcome == Outcome.INFRA_ERROR, text
        assert text in ans.result.error, (text, ans.result.error)


def test_launch_geometry_is_the_jobs():
    assert launch_geometry(_trial()) == ((8192, 1, 1), (128, 1, 1))
    assert launch_geometry(_trial(grid=None, block=None)) is None
    assert launch_refused((4, 1, 1), (2048, 1, 1)) == (
        "simulated: CUDA_ERROR_INVALID_VALUE: block [2048, 1, 1] (2048 threads; at most 1024, z at most 64)")
    assert "a dimension below 1" in launch_refused((0, 1, 1), (32, 1, 1))
    assert launch_refused((4, 1, 1), (32, 32, 1)) is None


@needs_nvrtc
def test_launches_cuda_would_refuse_are_launch_errors():
    sim = _sim()
    maps = _maps({"scale.cu": SOURCE})
    big = _answer(sim, _pod(_trial({"block_size_x": 2048, "tile": 1})), A100_LABELS, config_maps=maps).result
    assert big.outcome == Outcome.LAUNCH_ERROR and "2048 threads" in big.error
    unknown = _answer(sim, _pod(_trial(block=["block_size_y"])), A100_LABELS, config_maps=maps).result
    assert unknown.outcome == Outcome.LAUNCH_ERROR and "launch geometry" in unknown.error
    assert "block_size_y" in unknown.error
