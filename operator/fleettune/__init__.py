"""fleettune: a Kubernetes operator that tunes GPU kernels across a fleet."""

__version__ = "0.1.0"

GROUP = "fleettune.dev"
VERSION = "v1alpha1"
KIND = "TuningRun"
PLURAL = "tuningruns"
