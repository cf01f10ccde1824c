"""A batch Pod's work on a real GPU: one CUDA worker for the batch, compiled ahead with
NVRTC on the CPU (cubins loaded by the worker), and configurations that break the CUDA
context answered `runtime_error`, each in a fresh worker, with none of the batch lost."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_gpu_kernels import JOB_IMAGE, _user_scan, trial

from fleettune_job.ahead import AheadOptions
from fleettune_job.batch import run_batch
from fleettune_job.protocol import Batch, Entry, Outcome, decode_batch

pytestmark = pytest.mark.gpu

CONVOLUTION = [
    {},
    {"block_size_x": 32, "block_size_y": 4, "tile_size_x": 1, "tile_size_y": 3, "read_only": 1, "use_padding": 0,
     "use_shmem": 1},
    {"block_size_x": 128, "block_size_y": 2, "tile_size_x": 4, "tile_size_y": 1, "read_only": 1, "use_padding": 0,
     "use_shmem": 0},
    {"block_size_x": 1024, "block_size_y": 8},  # 8192 threads per block: never launched
]


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(JOB_IMAGE), os.environ.get("PYTHONPATH", "")) if p)}


def _batch(configs: list[dict[str, Any]], **kw: Any) -> Batch:
    one = trial("convolution", {}, [1024, 1024], **kw)
    common = one.model_dump(exclude={"index", "config"})
    return Batch.model_validate(common | {"entries": [Entry(index=i, config=c) for i, c in enumerate(configs)]})


def test_a_batch_is_compiled_ahead_and_measured_in_one_worker(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    ahead = AheadOptions.from_environment({})
    result = run_batch(_batch(CONVOLUTION), log, extra_env=_env(), ahead=ahead)
    assert result.done and result.exit_code == 0, result.error
    assert decode_batch(log.read_text()) == result  # what the kubelet would read
    outcomes = [a.o for a in result.answers]
    assert outcomes[:3] == [Outcome.OK] * 3 and outcomes[3].is_invalid_configuration, result.answers
    assert all(a.t and a.r and a.c is not None for a in result.answers[:3])
    assert result.fingerprint.product


def test_configurations_that_break_the_context_each_get_a_fresh_worker(tmp_path: Path) -> None:
    bad = _user_scan(tmp_path, "out[(long long)threadIdx.x * 4000000000LL + 4000000000LL] = 1.0f;")
    base = trial("scan", {}, [512, 64])
    entries = [Entry(index=0, config={}), Entry(index=1, config={}), Entry(index=2, config={})]
    common = base.model_dump(exclude={"index", "config"})
    batch = Batch.model_validate(common | {"entries": entries, "kernel": bad.model_dump(exclude_none=True)})
    log = tmp_path / "termination-log"
    result = run_batch(batch, log, extra_env=_env(), ahead=None)
    # Every entry of this source faults: each one in a fresh worker, none lost.
    assert [a.o for a in result.answers] == [Outcome.RUNTIME_ERROR] * 3, json.dumps(result.model_dump(mode="json"))
    assert result.done and result.exit_code == 0
