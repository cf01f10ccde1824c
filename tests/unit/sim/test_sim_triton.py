"""Triton trials in the simulator: compiled by Triton for the node's GPU, refused as Triton's
launcher refuses them, verified in Triton's interpreter, timed by a synthetic model (no
cluster, no GPU)."""

from __future__ import annotations

import pytest
from test_sim_user_source import A100_LABELS, _maps, _pod, _sim

from fleettune_dev.sim.batch import BatchAnswer
from fleettune_dev.sim.usersource import shared_memory_refused
from fleettune_job import tritonsource
from fleettune_job.protocol import TRIAL_ENV, Batch, Outcome, Trial

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def scale(x, out, n, BLOCK: tl.constexpr, SKIP_TAIL: tl.constexpr = 0):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n - SKIP_TAIL
    tl.store(out + offs, tl.load(x + offs, mask=mask) * 2.0, mask=mask)
'''
needs_triton = pytest.mark.skipif(not tritonsource.available(), reason="Triton is not installed (the triton extra)")


def _batch(*configs: dict) -> Batch:
    kernel = {"source_path": "/etc/fleettune/kernel/scale.py", "function": "scale", "language": "triton",
              "grid": ["cdiv(problem_size[0], BLOCK)"],
              "arguments": [{"name": "x", "length": "problem_size[0]"},
                            {"name": "out", "length": "problem_size[0]", "init": "zeros", "output": True},
                            {"name": "n", "kind": "scalar", "dtype": "int32", "value": "problem_size[0]"}],
              "verification": {"reference_config": {"BLOCK": 64, "num_warps": 4}}}
    return Batch.model_validate({"run": "r", "target": "a100", "kernel": kernel, "problem_size": [1000],
                                 "entries": [{"index": i, "config": c} for i, c in enumerate(configs)]})


def _answers(batch: Batch) -> BatchAnswer:
    trial = Trial.model_validate(batch.model_dump(exclude={"entries"}) | {"index": 0, "config": {}})
    pod = _pod(trial)
    pod["spec"]["containers"][0]["env"] = [{"name": TRIAL_ENV, "value": batch.to_env()}]
    return _sim().answer(pod, A100_LABELS, config_maps=_maps({"scale.py": SOURCE}))


@needs_triton
def test_each_configuration_is_compiled_verified_and_timed() -> None:
    answers = _answers(_batch({"BLOCK": 128, "num_warps": 4}, {"BLOCK": 128, "SKIP_TAIL": 1, "num_warps": 4},
                              {"BLOCK": 100, "num_warps": 4}))
    ok, wrong, bad = (a.answer.result for a in answers.answers)
    assert ok.outcome == Outcome.OK and ok.fingerprint.synthetic
    # Wrong outputs: the interpreter ran it and the job's own comparison caught it.
    assert wrong.outcome == Outcome.CORRECTNESS_ERROR, wrong.error
    assert "Triton's interpreter at problem size [128]" in wrong.error and "wrong result in out" in wrong.error
    # Triton's compiler refuses a block that is not a power of two, as on the GPU.
    assert bad.outcome == Outcome.COMPILE_ERROR and "power of 2" in bad.error


def test_more_shared_memory_than_the_gpu_has_fails_as_tritons_launcher_fails_it() -> None:
    assert shared_memory_refused(160 * 1024, "8.0") is None
    refused = shared_memory_refused(160 * 1024, "8.6")
    assert refused is not None and "out of resource: shared memory, Required: 163840, Hardware limit: 101376" in refused
