"""The fleet simulator: answers trial Pods on KWOK fake GPU nodes from recorded measurements
of each pool's GPU model (or synthetic models, always marked synthetic).

The names below are imported on first use: the pure modules (``startup``, ``batch``,
``recordings``) stay importable without the Kubernetes client the simulator loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleettune_dev.sim.answer import Answer, answer_trial
    from fleettune_dev.sim.recordings import Measurement, Recording, load_recording
    from fleettune_dev.sim.simulator import FleetSimulator
    from fleettune_dev.sim.startup import PodStartup

_WHERE = {
    "Answer": "answer", "answer_trial": "answer", "Measurement": "recordings", "Recording": "recordings",
    "load_recording": "recordings", "FleetSimulator": "simulator", "PodStartup": "startup",
}

__all__ = ["Answer", "FleetSimulator", "Measurement", "PodStartup", "Recording", "answer_trial", "load_recording"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
