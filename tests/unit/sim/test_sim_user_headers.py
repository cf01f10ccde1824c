"""The simulator compiles user source as the job does: the configuration as ``#define`` lines
of the source (parameters may be named ``size``, ``T``, ``a``...), the CUDA headers on the
include path (``cuda_fp16.h``, ``cuda_bf16.h``). No cluster; real NVRTC."""

from __future__ import annotations

from typing import Any

import pytest
from one_config import batch_env, only

from fleettune_dev.cluster.fleet import default_fleet
from fleettune_dev.sim import FleetSimulator
from fleettune_dev.sim.usersource import Compiler, compile_defines
from fleettune_job import nvrtc
from fleettune_job.protocol import TRIAL_ENV, Outcome, Trial

pytestmark = [
    pytest.mark.skipif(not nvrtc.available(), reason="libnvrtc is not installed"),
    pytest.mark.skipif(nvrtc.cuda_include_dir() is None, reason="no CUDA headers (nvidia-cuda-runtime-cu12)"),
]

FLEET = default_fleet()
SOURCE = """#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void scale(float *out, const float *in, int n) {
    const int i = blockIdx.x * size + threadIdx.x;
    if (i < n) out[i] = float(T(in[i]) * T(a)) + b * value;
}
"""
PATH = "/etc/fleettune/kernel/scale.cu"


def _trial(config: dict[str, Any]) -> Trial:
    return Trial.model_validate({
        "run": "r", "target": "a100", "index": 0, "problem_size": [1 << 16], "config": config,
        "kernel": {"source_path": PATH, "function": "scale", "grid": ["cdiv(problem_size[0], size)"],
                   "block": ["size"]},
    })


def _pod(trial: Trial) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
        "spec": {
            "nodeName": "a100-0",
            "volumes": [{"name": "kernel", "configMap": {"name": "kernels"}}],
            "containers": [{"name": "trial", "image": "t", "env": [{"name": TRIAL_ENV, "value": batch_env(trial)}],
                            "volumeMounts": [{"name": "kernel", "mountPath": "/etc/fleettune/kernel"}]}],
        },
    }


@pytest.mark.parametrize("t", ["__half", "__nv_bfloat16"])
def test_a_half_precision_kernel_with_common_parameter_names_compiles_and_gets_a_time(t: str) -> None:
    trial = _trial({"size": 128, "T": t, "a": 2, "b": 1, "value": 3})
    sim = FleetSimulator("/nonexistent/kubeconfig", FLEET, time_scale=0)
    answer = only(sim.answer(_pod(trial), FLEET.pool("a100").node_labels("a100-0"),
                             config_maps=lambda name: {"scale.cu": SOURCE} if name == "kernels" else None))
    assert answer.result.outcome == Outcome.OK, answer.result.error
    assert answer.result.objective and answer.result.fingerprint.synthetic


def test_the_compile_error_is_the_sources_own_line() -> None:
    broken = SOURCE.replace("b * value", "b * valeu")
    verdict = Compiler().check(broken, compile_defines(_trial({"size": 64, "T": "__half", "a": 1, "b": 0,
                                                                "value": 1})), "scale", "8.0")
    assert verdict is not None and 'line 6: error: identifier "valeu" is undefined' in verdict, verdict
