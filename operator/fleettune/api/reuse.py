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


# A serving stack's table file name: literal text with the placeholders {device} and
# {problem_size[i]}, ending in .json (no folder).
VLLM_FILE_NAME = r"^([^{}/]|\{device\}|\{problem_size\[[0-2]\]\})+\.json$"


class VllmTableSpec(Model):
    """How the tables vLLM and SGLang load are named and keyed."""

    file_name: str = Field(
        default="device_name={device}.json", max_length=253, pattern=VLLM_FILE_NAME,
        description="The table's file name: {device} is the GPU's name as the serving stack spells it (the "
        "driver's, spaces as underscores), {problem_size[i]} a dimension of the problem size; e.g. "
        "E=8,N={problem_size[1]},device_name={device}.json (fused MoE), with ,dtype=fp8_w8a8 before .json where "
        "the stack expects one. Sizes that differ only in batchDimension share a file.",
    )
    batch_dimension: int = Field(
        default=0, ge=0, le=2,
        description="The problem-size dimension that is the batch size M: each tuned M is a key of its table.",
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
    format: Literal["fleettune", "vllm"] = Field(
        default="fleettune",
        description="vllm: besides tuned.json and the flat keys, one table per GPU in the format vLLM and SGLang "
        "load (publish.vllm names them; mount them as docs/guide/publishing.md shows).",
    )
    vllm: VllmTableSpec = Field(default_factory=VllmTableSpec, description="With format: vllm, the tables' names.")
