"""Pydantic models of the TuningRun custom resource: the single source of its schema.

`fleettune crd` generates the CustomResourceDefinition's OpenAPI schema from these
models (see crd.py), and a test checks that the committed YAML matches, so the models
and the schema cannot drift. Structural checks (types, enums, bounds, required fields,
cross-field rules as CEL) are enforced by the API server at apply time; semantic checks
that need the search-space library (constraint expressions, value types, device limits)
are done by the operator and reported in a status condition naming the field.

The models are split by part of the object: `spec` (what to tune), `kernelsource` (a
user kernel's source, within the spec), `reuse` (what a run reuses and shares), `status`
(what the operator reports), `base` (their camelCase base model and shared bounds),
`kubernetes` (the schemas of the Kubernetes types the spec embeds, generated from an API
server's OpenAPI); every name is importable from `fleettune.api`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from fleettune.api.base import (
    CEL,
    CONFIG_MAP_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    MAX_PREDICTIONS,
    MAX_TUNED_TARGETS,
    Model,
)
from fleettune.api.kernelsource import (
    IDENTIFIER,
    ArgumentDtype,
    ArgumentSpec,
    Expression,
    SourceRef,
    TritonSourceRef,
    VerificationSpec,
)
from fleettune.api.reuse import FleetMemorySpec, PublishSpec, VllmTableSpec, WarmStartSpec
from fleettune.api.spec import (
    MAX_PROBLEM_SIZES,
    MAX_PULL_SECRETS,
    Affinity,
    BudgetSpec,
    Dimension,
    JobTemplateSpec,
    KernelSpec,
    LocalObjectReference,
    ObjectiveSpec,
    ParameterSpec,
    ParameterType,
    ProblemSizeSpec,
    QueueSpec,
    RangeSpec,
    RetunePolicy,
    StrategyName,
    StrategySpec,
    TargetSpec,
    Toleration,
    TuningRunSpec,
)
from fleettune.api.status import (
    Condition,
    ConfigResult,
    Fingerprint,
    Phase,
    Prediction,
    PriorKind,
    PriorSource,
    RankedConfig,
    ResultsRef,
    TargetPhase,
    TargetStatus,
    TrialCounts,
    TunedFor,
    TuningRunStatus,
)


class TuningRun(Model):
    """A whole object, as read from the API server (metadata kept as a plain dict)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    api_version: str = "fleettune.dev/v1alpha1"
    kind: str = "TuningRun"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TuningRunSpec
    status: TuningRunStatus | None = None


__all__ = [
    "CEL",
    "CONFIG_MAP_KEY",
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "IDENTIFIER",
    "MAX_PREDICTIONS",
    "MAX_PROBLEM_SIZES",
    "MAX_PULL_SECRETS",
    "MAX_TUNED_TARGETS",
    "Affinity",
    "ArgumentDtype",
    "ArgumentSpec",
    "BudgetSpec",
    "Condition",
    "ConfigResult",
    "Dimension",
    "Expression",
    "Fingerprint",
    "FleetMemorySpec",
    "JobTemplateSpec",
    "KernelSpec",
    "LocalObjectReference",
    "Model",
    "ObjectiveSpec",
    "ParameterSpec",
    "ParameterType",
    "Phase",
    "Prediction",
    "PriorKind",
    "PriorSource",
    "ProblemSizeSpec",
    "PublishSpec",
    "QueueSpec",
    "RangeSpec",
    "RankedConfig",
    "ResultsRef",
    "RetunePolicy",
    "SourceRef",
    "StrategyName",
    "StrategySpec",
    "TargetPhase",
    "TargetSpec",
    "TargetStatus",
    "Toleration",
    "TrialCounts",
    "TritonSourceRef",
    "TunedFor",
    "TuningRun",
    "TuningRunSpec",
    "TuningRunStatus",
    "VerificationSpec",
    "VllmTableSpec",
    "WarmStartSpec",
]
