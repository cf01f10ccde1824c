"""The fleet simulator: answers trial Pods on KWOK fake GPU nodes from recorded measurements
of each pool's GPU model (or synthetic models, always marked synthetic)."""

from fleettune_dev.sim.answer import Answer, answer_trial
from fleettune_dev.sim.recordings import Measurement, Recording, load_recording
from fleettune_dev.sim.simulator import FleetSimulator

__all__ = ["Answer", "FleetSimulator", "Measurement", "Recording", "answer_trial", "load_recording"]
