"""What a TuningRun's spec means to the operator, beyond what the CRD schema checks (pure).

Errors name the field (`spec.strategy.options.foo: ...`) so a user can fix the run from
its `Ready` condition alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from fleettune.api import TuningRunSpec

if TYPE_CHECKING:
    from fleettune.admission import TrialPolicy
from fleettune.names import short_hash


class SpecError(ValueError):
    """A spec the API server accepted but the operator cannot run; names the field.
    ``reason``: the `Ready` condition's (InvalidSpec, or the trial policy's Forbidden...)."""

    def __init__(self, message: str, reason: str = "InvalidSpec") -> None:
        super().__init__(message)
        self.reason = reason


def checked_spec(raw: Mapping[str, Any], policy: TrialPolicy | None) -> TuningRunSpec:
    """The spec, parsed and checked as far as it can be without the cluster: the kernel
    (built-in, expressions), node selectors, and the trial policy (`policy`: the operator's;
    None: read from the environment)."""
    from fleettune.admission import AdmissionError, TrialPolicy, check_node_selectors, check_trial_policy
    from fleettune.kernelcheck import KernelSpecError, check_kernel

    spec = parse_spec(raw)
    try:
        check_kernel(spec)
        check_node_selectors(spec)
        check_trial_policy(spec, policy or TrialPolicy.from_env())
    except KernelSpecError as exc:
        raise SpecError(str(exc)) from None
    except AdmissionError as exc:
        raise SpecError(str(exc), exc.reason) from None
    return spec


def field_path(loc: tuple[Any, ...]) -> str:
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def parse_spec(raw: Mapping[str, Any]) -> TuningRunSpec:
    try:
        spec = TuningRunSpec.model_validate(dict(raw))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise SpecError(f"{field_path(err['loc'])}: {err['msg']}") from None
    if not spec.kernel.sizes():  # the CRD's CEL rule says so; the model alone does not
        raise SpecError("spec.kernel.problemSize: set kernel.problemSize or kernel.problemSizes")
    return spec


def retune_key(token: str) -> str:
    """What status.lastHandledRetuneAt holds for a re-tune token: the token, or a hash of an
    annotation too long to repeat in the status (compared the same way after a restart)."""
    return token if len(token) <= 128 else f"sha256:{short_hash(token, 64)}"


def space_hash(spec: TuningRunSpec) -> str:
    """What makes results comparable: a change starts a new round on every pool."""
    doc = {
        "kernel": spec.kernel.dump(),
        "parameters": [p.dump() for p in spec.parameters],
        "constraints": list(spec.constraints),
        "objective": spec.objective.dump(),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


def check_options(spec: TuningRunSpec) -> None:
    """The strategy's options, checked by the strategy itself (`optimize.validate_options`):
    known keys, accepted values; the error names the field. A former option (now fixed, or
    replaced) is refused as such, ``no longer an option: ...``, never silently ignored. The
    strategy's tuning knobs are not reachable from a spec: the operator builds studies with
    the public options alone."""
    from fleettune.optimize import OptionError, UnknownStrategyError, validate_options

    try:
        validate_options(spec.strategy.name, spec.strategy.options)
    except OptionError as exc:
        raise SpecError(f"spec.strategy.options.{exc.key}: {exc.message}") from None
    except UnknownStrategyError as exc:
        raise SpecError(f"spec.strategy.name: {exc}") from None
