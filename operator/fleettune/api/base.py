"""The base of the TuningRun models and the bounds that both the spec and the status use."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

CEL = "x-kubernetes-validations"
# The status must stay far below the API server's object limit whatever the spec asks:
# targets × problem sizes (one status.targets entry each) and targets × predictFor sizes
# (one status.predictions entry each) are bounded.
MAX_TUNED_TARGETS = 24
MAX_PREDICTIONS = 24
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
CONFIG_MAP_KEY = r"^[-._a-zA-Z0-9]+$"


class Model(BaseModel):
    """camelCase in the object, snake_case in code; unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def dump(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

