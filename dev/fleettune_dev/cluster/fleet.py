"""The fleet file: which fake GPU node pools a local cluster has, and how each is simulated.

A fleet file is YAML (``kind: Fleet``). Each pool becomes ``nodes`` KWOK nodes labelled the
way GPU Feature Discovery labels real ones, so the operator selects them exactly as it
would in production. The ``simulation`` block tells the fleet simulator where each pool's
numbers come from: a recording of that GPU model, or a synthetic model derived from
another recording (marked synthetic in every result). A built-in kernel a pool has neither
for is answered by the simulator's synthetic model of the kernel itself
(`fleettune_dev.sim.builtin`), marked synthetic too.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from fleettune.fingerprint import (
    ARCH,
    FT_DRIVER,
    FT_L4T,
    FT_PRODUCT,
    GFD_CC_MAJOR,
    GFD_CC_MINOR,
    GFD_DRIVER,
    GFD_FAMILY,
    GFD_MEMORY,
    GFD_PRODUCT,
    GFD_RUNTIME,
)
from fleettune.labels import POOL_LABEL

# GFD labels the operator does not read (the fingerprint's are imported above).
GFD_PRESENT = "nvidia.com/gpu.present"
GFD_COUNT = "nvidia.com/gpu.count"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


class FleetError(ValueError):
    """A fleet file that cannot be used; the message names the file and the field."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


def label_value(text: str) -> str:
    """GFD's spelling of a product name as a label value: spaces become dashes."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text.strip()).strip("-_.")[:63]


class Gpu(_Model):
    product: str = Field(min_length=1, description="as nvidia-smi names it, e.g. 'NVIDIA A100-PCIE-40GB'")
    family: str = Field(default="", description="GFD's architecture family, e.g. 'ampere'")
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    memory_mib: int = Field(alias="memoryMiB", gt=0)
    per_node: int = Field(gt=0, le=64, description="GPUs per node (capacity of nvidia.com/gpu)")
    driver_version: str = Field(min_length=1)
    cuda_runtime_version: str = Field(min_length=1)

    @property
    def compute_major(self) -> str:
        return self.compute_capability.split(".")[0]

    @property
    def compute_minor(self) -> str:
        return self.compute_capability.split(".")[1]


class Jetson(_Model):
    l4t_version: str = Field(alias="l4tVersion", min_length=1)


class Taint(_Model):
    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class NodeResources(_Model):
    cpu: str = "32"
    memory: str = "128Gi"
    pods: str = "110"


class SyntheticModel(_Model):
    """Times of another recording × ``slowdown`` × a deterministic per-configuration noise."""

    source: str = Field(alias="from", min_length=1, description="recording name or path")
    slowdown: float = Field(gt=0)
    noise: float = Field(default=0.05, ge=0, le=0.5, description="relative spread of the noise")


class Simulation(_Model):
    recordings: dict[str, str] = Field(default_factory=dict, description="built-in kernel → recording")
    synthetic: dict[str, SyntheticModel] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_source_per_kernel(self) -> Simulation:
        both = sorted(set(self.recordings) & set(self.synthetic))
        if both:
            raise ValueError(f"kernel(s) {', '.join(both)} have both a recording and a synthetic model")
        return self

    def kernels(self) -> list[str]:
        return sorted({*self.recordings, *self.synthetic})


class NodePool(_Model):
    """A pool of the simulated fleet: ``nodes`` identical fake GPU nodes and how the
    simulator answers their trials (not the operator's per-target tuning state,
    `fleettune.controller.pool.Pool`)."""

    name: str
    nodes: int = Field(gt=0, le=100)
    arch: Literal["amd64", "arm64"] = "amd64"
    gpu: Gpu
    feature_discovery: bool = Field(
        default=True, description="label nodes as GPU Feature Discovery would (false on Jetson)")
    jetson: Jetson | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    resources: NodeResources = NodeResources()
    simulation: Simulation = Simulation()

    @field_validator("name")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        if not _DNS_LABEL.match(v) or len(v) > 50:
            raise ValueError(f"{v!r} is not a DNS label of at most 50 characters (a-z, 0-9, '-')")
        return v

    @field_validator("labels")
    @classmethod
    def _label_values(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(value) > 63 or not _LABEL_VALUE.match(value):
                raise ValueError(f"label {key}={value!r} is not a valid label value")
        return v

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.nodes)]

    def node_labels(self, node_name: str) -> dict[str, str]:
        g = self.gpu
        labels = {
            "type": "kwok",
            POOL_LABEL: self.name,
            ARCH: self.arch,
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": node_name,
        }
        if self.feature_discovery:
            labels |= {
                GFD_PRESENT: "true",
                GFD_PRODUCT: label_value(g.product),
                GFD_CC_MAJOR: g.compute_major,
                GFD_CC_MINOR: g.compute_minor,
                GFD_MEMORY: str(g.memory_mib),
                GFD_COUNT: str(g.per_node),
                GFD_DRIVER: g.driver_version,
                GFD_RUNTIME: g.cuda_runtime_version,
            }
            if g.family:
                labels[GFD_FAMILY] = g.family
        else:
            # GFD does not run on Jetson: the project labels these nodes itself.
            labels |= {
                FT_PRODUCT: label_value(g.product),
                FT_DRIVER: g.driver_version,
            }
        if self.jetson is not None:
            labels[FT_L4T] = self.jetson.l4t_version
        return labels | self.labels

    def node_manifest(self, node_name: str) -> dict[str, Any]:
        r = self.resources
        capacity = {"cpu": r.cpu, "memory": r.memory, "pods": r.pods, GPU_RESOURCE: str(self.gpu.per_node)}
        spec: dict[str, Any] = {}
        if self.taints:
            spec["taints"] = [t.model_dump(exclude_defaults=False) for t in self.taints]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node_name,
                # kwok manages only nodes with this annotation: real nodes that join the
                # same cluster are never touched by it or by the simulator.
                "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": self.node_labels(node_name),
            },
            "spec": spec,
            "status": {
                "capacity": capacity,
                "allocatable": dict(capacity),
                # kwok's node-initialize stage keeps these and fills the empty ones.
                "nodeInfo": {"architecture": self.arch, "operatingSystem": "linux", **dict.fromkeys((
                    "bootID", "containerRuntimeVersion", "kernelVersion", "kubeProxyVersion",
                    "kubeletVersion", "machineID", "osImage", "systemUUID"), "")},
            },
        }


class Fleet(_Model):
    api_version: Literal["fleettune.dev/v1alpha1"] = "fleettune.dev/v1alpha1"
    kind: Literal["Fleet"] = "Fleet"
    pools: list[NodePool] = Field(min_length=1)
    # Where relative recording paths are resolved; set by load_fleet, not part of the file.
    _base_dir: Path | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _unique_pools(self) -> Fleet:
        seen: set[str] = set()
        for p in self.pools:
            if p.name in seen:
                raise ValueError(f"pool name {p.name!r} is used twice")
            seen.add(p.name)
        return self

    def pool(self, name: str) -> NodePool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(f"no pool named {name!r} in the fleet (pools: {', '.join(self.pool_names())})")

    def pool_names(self) -> list[str]:
        return [p.name for p in self.pools]

    def node_manifests(self) -> list[dict[str, Any]]:
        return [p.node_manifest(n) for p in self.pools for n in p.node_names()]

    def to_yaml(self) -> str:
        """The fleet as a fleet file, with relative recording paths made absolute."""
        body = self.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        doc = {"apiVersion": self.api_version, "kind": self.kind, **body}
        for pool in doc["pools"]:
            sim = pool.get("simulation", {})
            for kernel, ref in sim.get("recordings", {}).items():
                sim["recordings"][kernel] = self._portable_ref(ref)
            for model in sim.get("synthetic", {}).values():
                model["from"] = self._portable_ref(model["from"])
        return yaml.safe_dump(doc, sort_keys=False)

    def _portable_ref(self, ref: str) -> str:
        return ref if _is_packaged_ref(ref) else str(self.recording_path(ref).resolve())

    def recording_path(self, ref: str) -> Path:
        """A bare name is a recording shipped with fleettune; anything else a file path."""
        if _is_packaged_ref(ref):
            path = packaged_recordings_dir() / f"{ref}.json.gz"
            if not path.is_file():
                known = sorted(p.name.removesuffix(".json.gz") for p in packaged_recordings_dir().glob("*.json.gz"))
                raise FleetError(f"no packaged recording named {ref!r} (known: {', '.join(known)})")
            return path
        path = Path(ref).expanduser()
        if not path.is_absolute() and self._base_dir is not None:
            path = self._base_dir / path
        if not path.is_file():
            raise FleetError(f"recording file {path} does not exist")
        return path


def _is_packaged_ref(ref: str) -> bool:
    return "/" not in ref and not ref.endswith((".json", ".gz"))


def packaged_data_dir() -> Path:
    return Path(str(resources.files("fleettune_dev") / "data"))


def packaged_recordings_dir() -> Path:
    return packaged_data_dir() / "recordings"


DEFAULT_FLEET_FILE = "fleet-demo.yaml"


def _format_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ""
        for part in err["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        lines.append(f"  {loc or '(file)'}: {err['msg']}")
    return "\n".join(lines)


def parse_fleet(data: Any, *, source: str = "<fleet>", base_dir: Path | None = None) -> Fleet:
    if not isinstance(data, dict):
        raise FleetError(f"{source}: a fleet file must be a YAML mapping with `pools:`")
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        raise FleetError(f"{source}: invalid fleet file:\n{_format_errors(exc)}") from None
    fleet._base_dir = base_dir
    # Fail at load time, not when the first trial arrives: every referenced recording exists.
    for pool in fleet.pools:
        refs = [*pool.simulation.recordings.values(), *(m.source for m in pool.simulation.synthetic.values())]
        for ref in refs:
            try:
                fleet.recording_path(ref)
            except FleetError as exc:
                raise FleetError(f"{source}: pool {pool.name!r}: {exc}") from None
    return fleet


def load_fleet(path: str | Path) -> Fleet:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise FleetError(f"cannot read fleet file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML: {exc}") from None
    return parse_fleet(data, source=str(path), base_dir=path.parent.resolve())


def default_fleet() -> Fleet:
    """The demo fleet shipped with fleettune (A100, RTX A4000 and Jetson AGX Orin pools)."""
    return load_fleet(packaged_data_dir() / DEFAULT_FLEET_FILE)
