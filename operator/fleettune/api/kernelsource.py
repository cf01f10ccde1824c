"""A user kernel's source: where it is, what to launch, with which data, how its outputs are checked."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints

from fleettune.api.base import CEL, CONFIG_MAP_KEY, DNS_SUBDOMAIN, Model

IDENTIFIER = r"^[A-Za-z_][A-Za-z0-9_]*$"
Expression = Annotated[str, StringConstraints(min_length=1, max_length=500)]
ArgumentDtype = Literal[
    "float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
]


class ArgumentSpec(Model):
    """One argument of a user kernel, in the kernel's parameter order."""

    model_config = ConfigDict(json_schema_extra={CEL: [
        {"rule": "self.kind != 'array' || has(self.length)", "message": "an array argument needs a length",
         "fieldPath": ".length"},
        {"rule": "self.kind != 'scalar' || has(self.value)", "message": "a scalar argument needs a value",
         "fieldPath": ".value"},
        {"rule": "self.kind != 'scalar' || !has(self.output) || !self.output",
         "message": "a scalar argument cannot be an output", "fieldPath": ".output"},
        {"rule": "!has(self.init) || self.init != 'constant' || has(self.constant)",
         "message": "init: constant needs constant", "fieldPath": ".constant"},
        {"rule": "!has(self.init) || self.init != 'data' || has(self.dataKey)",
         "message": "init: data needs dataKey", "fieldPath": ".dataKey"},
    ]})

    name: str = Field(pattern=IDENTIFIER, max_length=63, description="The argument's name (for messages).")
    kind: Literal["array", "scalar"] = Field(
        default="array", description="array: a device buffer; scalar: a value passed to the kernel."
    )
    dtype: ArgumentDtype = Field(default="float32", description="Element type (the kernel's C type).")
    length: Expression | None = Field(
        default=None,
        description="Arrays: number of elements, an expression of problem_size (e.g. problem_size[0] * "
        "problem_size[1]); not of parameters, so every configuration solves the same problem.",
    )
    value: Expression | None = Field(
        default=None, description="Scalars: an expression of the parameters and problem_size."
    )
    init: Literal["random", "zeros", "constant", "data"] = Field(
        default="random",
        description="Arrays: initial data. random: uniform in [0, 1) (integers: 0-99), seeded; zeros; constant; "
        "data: numbers from the key dataKey of the source ConfigMap.",
    )
    constant: float | None = Field(default=None, description="The value of every element, with init: constant.")
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1, description="Seed of init: random.")
    data_key: str | None = Field(
        default=None, max_length=253, pattern=CONFIG_MAP_KEY,
        description="With init: data, the key of the source ConfigMap holding the elements (text: numbers "
        "separated by whitespace or commas).",
    )
    output: bool = Field(default=False, description="The kernel writes it: compared with the reference.")


class VerificationSpec(Model):
    """How a configuration's outputs are checked before it may count as valid."""

    reference_function: str | None = Field(
        default=None, pattern=IDENTIFIER, max_length=128,
        description="A reference kernel in the same source, launched with kernel.defaultConfig; default: the "
        "tuned kernel itself with kernel.defaultConfig.",
    )
    # No schema defaults: Helm re-renders 1.0e-06 as 1e-06, which YAML 1.1 reads as a string.
    atol: float | None = Field(default=None, ge=0, description="Absolute tolerance per element (default 1e-6).")
    rtol: float | None = Field(
        default=None, ge=0, description="Tolerance relative to the reference's element (default 1e-5)."
    )


class UserSource(Model):
    """What CUDA and Triton source share: where the source is, what to launch, with which data."""

    model_config = ConfigDict(json_schema_extra={CEL: [
        {"rule": "self.arguments.exists(a, has(a.output) && a.output)",
         "message": "arguments: at least one array must be an output (what is verified)", "fieldPath": ".arguments"},
        {"rule": "self.arguments.all(a, self.arguments.exists_one(b, b.name == a.name))",
         "message": "arguments: names must be unique", "fieldPath": ".arguments"},
    ]})

    config_map: str = Field(
        max_length=253, pattern=DNS_SUBDOMAIN, description="ConfigMap (in the run's namespace) holding the source."
    )
    key: str = Field(
        default="kernel.cu", max_length=253, pattern=CONFIG_MAP_KEY, description="Key of the source in it."
    )
    function: str = Field(pattern=IDENTIFIER, max_length=128, description="Kernel function name (extern \"C\").")
    grid: list[Expression] = Field(
        min_length=1, max_length=3,
        description="Grid size (blocks) per dimension, expressions of parameters and problem_size.",
    )
    arguments: list[ArgumentSpec] = Field(
        min_length=1, max_length=32,
        description="The kernel's arguments in order: arrays (with their data) and scalars. At least one array "
        "must be an output.",
    )
    verification: VerificationSpec = Field(
        default_factory=VerificationSpec,
        description="Each configuration's outputs must match the reference's, or it is a correctness_error.",
    )


class SourceRef(UserSource):
    """User CUDA source held in a ConfigMap of the run's namespace."""

    block: list[Expression] = Field(
        min_length=1, max_length=3, description="Block size (threads) per dimension, expressions."
    )


class TritonSourceRef(UserSource):
    """A Triton kernel (a module with @triton.jit functions) held in a ConfigMap of the run's namespace."""

    key: str = Field(
        default="kernel.py", max_length=253, pattern=CONFIG_MAP_KEY, description="Key of the source in it."
    )
    function: str = Field(pattern=IDENTIFIER, max_length=128, description="The @triton.jit function to tune.")
    grid: list[Expression] = Field(
        min_length=1, max_length=3,
        description="Grid size (programs) per dimension, expressions of parameters and problem_size.",
    )
    arguments: list[ArgumentSpec] = Field(
        min_length=1, max_length=32,
        description="The function's runtime arguments in order (every parameter before its tl.constexpr ones): "
        "arrays (with their data) and scalars. At least one array must be an output.",
    )
