"""Shared test setup: the source roots are importable without an install, and torch
computes on one thread in every test process."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
for src in ("operator", "job_image", "dev"):
    path = str(ROOT / src)
    if path not in sys.path:
        sys.path.insert(0, path)

# Read by torch when it is first imported here, and by the operators the integration tests
# start (FLEETTUNE_MODEL_THREADS): two test workers and the operator on two cores, each with
# a thread per core, made the GP fits five times slower (threads waiting on each other).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["FLEETTUNE_MODEL_THREADS"] = "1"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With pytest-xdist (`make test` runs two workers), every test of the control plane
    runs in one worker, in order, as does every GPU test: another worker would start a
    second cluster, or share the device's timings. The unit tests fill the other worker
    meanwhile. (xdist's own `--dist loadgroup` marks cannot do it under pytest 9: the
    suffix it gives a test's id no longer reaches the scheduler.)"""
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerPerResource(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            part = nodeid.split("/")[1:2]
            return part[0] if part in (["integration"], ["gpu"]) else nodeid

    return OneWorkerPerResource(config, log)
