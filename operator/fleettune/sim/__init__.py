"""The fleet simulator: answers trial Pods on KWOK fake GPU nodes from recorded measurements
of each pool's GPU model (or synthetic models, always marked synthetic)."""

from fleettune.sim.answer import Answer, answer_trial
from fleettune.sim.recordings import Measurement, Recording, load_recording
from fleettune.sim.simulator import FleetSimulator

__all__ = ["Answer", "FleetSimulator", "Measurement", "Recording", "answer_trial", "load_recording"]
