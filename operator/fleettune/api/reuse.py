"""What a run reuses and shares: results a user already has (`warmStart`), what earlier runs
of the same kernel measured (`fleetMemory`), and the best configurations it publishes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from fleettune.api.base import CONFIG_MAP_KEY, DNS_LABEL, DNS_SUBDOMAIN, Model


class WarmStartSpec(Model):
    """Results you already have, in a ConfigMap of the run's namespace: a Kernel Tuner cache or
    a T4 results file of the same kernel (another GPU, driver or problem size is fine)."""

    config_map: str = Field(
        max_length=253, pattern=DNS_SUBDOMAIN, description="ConfigMap (in the run's namespace) holding the file."
    )
    key: str = Field(max_length=253, pattern=CONFIG_MAP_KEY, description="Key of the file in it (JSON text).")
    format: Literal["kernel-tuner", "t4"] = Field(
        default="kernel-tuner", description="kernel-tuner: a Kernel Tuner cache file; t4: a T4 results file."
    )
    targets: list[Annotated[str, StringConstraints(pattern=DNS_LABEL, max_length=63)]] | None = Field(
        default=None, min_length=1, max_length=16,
        description="The targets it warm-starts (default: all). Each pool weighs it by how well it agrees with "
        "the pool's own first results, and drops it when it misleads.",
    )


class FleetMemorySpec(Model):
    """The fleet as one learner: every pool's search starts from what the run's other pools
    measure at its problem size (refreshed as they measure) and from what earlier runs of the
    same kernel recorded, in this namespace (and the namespaces the operator's configuration
    lets share); no file to export or name."""

    enabled: bool = Field(
        default=True, description="Start from the run's other pools and earlier runs of the same kernel "
        "(false: each pool starts from spec.warmStart and its own target's results only).",
    )
    retain_on_delete: bool = Field(
        default=False, description="Keep this run's results store when the run is deleted, for later runs "
        "to start from (deleted with the run otherwise).",
    )


class PublishSpec(Model):
    config_map_name: str = Field(
        max_length=253, pattern=DNS_SUBDOMAIN, description="ConfigMap that receives the best configuration per pool."
    )
    retain_on_delete: bool = Field(
        default=False, description="Keep the ConfigMap when the run is deleted (applications keep starting)."
    )
    include_predicted: bool = Field(default=False, description="Also publish status.predictions for each pool and "
                                    "size with no measured best, marked source=predicted (a measurement replaces it).")
