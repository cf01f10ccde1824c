"""Typed tuning parameters and their validation from the TuningRun CRD shape.

Every parameter is discrete once built: it has a tuple of ``values`` and a configuration is
stored as one index per parameter ("index row"). Reals therefore need a ``step`` (or explicit
``values``); a continuous real cannot be enumerated or counted, and the optimiser works on
candidate sets, so we ask for the discretisation up front instead of guessing one.
"""

from __future__ import annotations

import itertools
import keyword
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from fleettune.names import did_you_mean
from fleettune.space.errors import SpaceError

TYPES = ("integer", "ordinal", "real", "categorical", "boolean", "permutation")
NUMERIC_TYPES = ("integer", "ordinal", "real")
SCALES = ("linear", "log")

# One parameter's value list is held in memory (values, lookup tables, encodings), so its size
# is bounded; 9! = 362 880 permutations fits, 10! does not.
MAX_VALUES = 1_000_000
MAX_PERMUTATION_SIZE = 9

# Names that would be ambiguous inside a constraint expression.
RESERVED_NAMES = frozenset({"device", "min", "max", "abs", "True", "False", "None"})
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_ALLOWED_KEYS = {
    "integer": {"range", "values", "scale"},
    "ordinal": {"values", "scale"},
    "real": {"range", "values", "scale"},
    "categorical": {"values"},
    "boolean": set(),
    "permutation": {"size"},
}
_COMMON_KEYS = {"name", "type", "default", "description"}

_TYPE_HINTS = {"int": "integer", "float": "real", "bool": "boolean", "str": "categorical",
               "string": "categorical", "enum": "categorical", "double": "real", "list": "ordinal"}


@dataclass(frozen=True, eq=False)
class Parameter:
    """One tuning parameter. ``values`` are plain Python values in index order."""

    name: str
    type: str
    values: tuple[Any, ...]
    default: Any = None
    scale: str = "linear"
    size: int | None = None  # permutations only: number of items
    has_default: bool = field(default=False)
    spec: dict[str, Any] = field(default_factory=dict, repr=False)  # the CRD-shaped input, normalised

    @property
    def kind(self) -> str:
        """Feature kind for models: "numeric", "categorical" or "permutation"."""
        if self.type in NUMERIC_TYPES:
            return "numeric"
        return "permutation" if self.type == "permutation" else "categorical"

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, self.values[:6])) + (", ..." if len(self.values) > 6 else "")
        return f"Parameter({self.name!r}, {self.type}, [{shown}] ({len(self.values)} values))"

    @cached_property
    def array(self) -> np.ndarray:
        """Values as a numpy array for vectorised constraint evaluation.

        Permutations are represented by their index (constraints compare them through
        `permutation_table`); categorical values of mixed types become an object array so that
        Python's comparison semantics still hold.
        """
        if self.type == "permutation":
            return np.arange(len(self.values), dtype=np.int64)
        if self.type == "boolean":
            return np.array(self.values, dtype=bool)
        vals = self.values
        if all(isinstance(v, bool) for v in vals):
            return np.array(vals, dtype=bool)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            if all(-(2**62) < v < 2**62 for v in vals):
                return np.array(vals, dtype=np.int64)
            return np.array(vals, dtype=np.float64)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            return np.array(vals, dtype=np.float64)
        if all(isinstance(v, str) for v in vals):
            return np.array(vals, dtype=str)
        return np.array(vals, dtype=object)

    @cached_property
    def value_kind(self) -> str:
        """What a constraint sees: "num", "str", "perm" or "mixed"."""
        if self.type == "permutation":
            return "perm"
        dtype = self.array.dtype
        if dtype.kind in "biuf":
            return "num"
        if dtype.kind == "U":
            return "str"
        return "mixed"

    @cached_property
    def permutation_table(self) -> np.ndarray:
        """(n!, n) int64 table: row i is the i-th permutation (item at each position)."""
        if self.type != "permutation":
            raise TypeError(f"{self.name} is not a permutation parameter")
        return np.array(self.values, dtype=np.int64).reshape(len(self.values), self.size or 0)

    @cached_property
    def lookup(self) -> dict[Any, int]:
        """Value → index. Keys are normalised by `value_key` so that 32 and 32.0 match but 1 and True don't."""
        return {value_key(self, v): i for i, v in enumerate(self.values)}

    @cached_property
    def sorted_order(self) -> np.ndarray:
        """Index positions sorted by value (numeric parameters), i.e. what "adjacent" means."""
        if self.kind != "numeric":
            return np.arange(len(self.values))
        return np.argsort(np.asarray(self.values, dtype=np.float64), kind="stable")

    def index_of(self, value: Any) -> int | None:
        """Index of ``value`` in the value list, or None if it is not one of the values."""
        try:
            key = value_key(self, value)
        except (TypeError, ValueError):
            return None
        idx = self.lookup.get(key)
        if idx is None and self.type == "real" and isinstance(key, float) and math.isfinite(key):
            # Reals built from a step carry rounding noise; accept a value within 1e-9 relative.
            arr = np.asarray(self.values, dtype=np.float64)
            close = np.flatnonzero(np.isclose(arr, key, rtol=1e-9, atol=1e-12))
            idx = int(close[0]) if close.size else None
        return idx

    def plain(self, value: Any) -> Any:
        """A JSON-able Python value (permutations become lists)."""
        return list(value) if self.type == "permutation" else value


def value_key(param: Parameter, value: Any) -> Any:
    """Hashable key under which ``value`` is looked up in ``param``'s value list."""
    if isinstance(value, np.generic):
        value = value.item()
    if param.type == "permutation":
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
            raise TypeError("a permutation value is a list of item numbers")
        items = [v.item() if isinstance(v, np.generic) else v for v in value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise TypeError("permutation items must be integers")
        return tuple(items)
    if param.type == "boolean":
        if not isinstance(value, bool):
            raise TypeError("expected true or false")
        return value
    if param.kind == "numeric":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("expected a number")
        return value
    # categorical: keep booleans apart from the numbers they compare equal to
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", value)
    if isinstance(value, str):
        return ("str", value)
    raise TypeError("expected a string, number or boolean")


# ---------------------------------------------------------------------------------------------
# Building from the CRD shape


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_power_of_two_list(values: tuple[Any, ...]) -> bool:
    """Positive powers of two (at least three of them): the values a log scale is made for."""
    return len(values) >= 3 and all(
        _is_number(v) and v > 0 and float(v).is_integer() and (int(v) & (int(v) - 1)) == 0 for v in values
    )


def check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name:
        raise SpaceError(where, "a parameter needs a non-empty string name")
    if not _IDENTIFIER.match(name) or keyword.iskeyword(name):
        raise SpaceError(where, f"parameter name {name!r} must be an identifier (letters, digits, '_', "
                                "not starting with a digit, not a Python keyword) so constraints can name it")
    if name in RESERVED_NAMES:
        raise SpaceError(where, f"parameter name {name!r} is reserved in constraint expressions")
    return name


def _values_list(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, (list, tuple)):
        raise SpaceError(where, f"expected a list of values, got {type(raw).__name__}")
    if len(raw) == 0:
        raise SpaceError(where, "the value list is empty")
    if len(raw) > MAX_VALUES:
        raise SpaceError(where, f"{len(raw)} values is more than the supported {MAX_VALUES}")
    return list(raw)


def _check_unique(param_type: str, values: list[Any], where: str) -> None:
    probe = Parameter("_", param_type, ())
    seen: dict[Any, int] = {}
    for i, v in enumerate(values):
        key = value_key(probe, v)
        if key in seen:
            raise SpaceError(f"{where}[{i}]", f"duplicate value {v!r} (same as {where}[{seen[key]}])")
        seen[key] = i


def _integral(v: Any, where: str) -> Any:
    """A float holding an integer as that int (others unchanged, for the caller's checks);
    a finite float with a fraction is an error naming the field."""
    if isinstance(v, float) and math.isfinite(v):
        if not v.is_integer():
            raise SpaceError(where, f"expected an integer (an integer parameter's range), got {v!r}")
        return int(v)
    return v


def _range_values(spec: Any, ptype: str, where: str) -> list[Any]:
    if not isinstance(spec, dict):
        raise SpaceError(where, "expected an object {min, max, step}")
    unknown = set(spec) - {"min", "max", "step"}
    if unknown:
        raise SpaceError(where, f"unknown key(s) {sorted(unknown)}; a range has min, max and step")
    lo, hi, step = spec.get("min"), spec.get("max"), spec.get("step")
    if lo is None or hi is None:
        raise SpaceError(where, "a range needs both 'min' and 'max'")
    check = _is_int if ptype == "integer" else _is_number
    if ptype == "integer":
        # The CRD's range is `type: number` (shared with real parameters), so a manifest's
        # 1 arrives as 1.0: a float without a fractional part is that integer.
        lo, hi, step = (_integral(v, f"{where}.{key}") for key, v in (("min", lo), ("max", hi), ("step", step)))
    for key, v in (("min", lo), ("max", hi)):
        if not check(v):
            want = "an integer" if ptype == "integer" else "a number"
            raise SpaceError(f"{where}.{key}", f"expected {want}, got {v!r}")
    if step is None:
        if ptype == "real":
            raise SpaceError(where, "a real parameter needs a 'step' (or an explicit 'values' list): "
                                    "continuous reals cannot be enumerated")
        step = 1
    if not check(step) or step <= 0:
        want = "integer" if ptype == "integer" else "number"
        raise SpaceError(f"{where}.step", f"the step must be a positive {want}, got {step!r}")
    if lo > hi:
        raise SpaceError(where, f"min ({lo}) is greater than max ({hi})")
    if ptype == "integer":
        count = (hi - lo) // step + 1  # exact: integer bounds up to 1e308 overflow a float span
    else:
        span = (hi - lo) / step
        if not math.isfinite(lo) or not math.isfinite(hi) or not math.isfinite(span):
            raise SpaceError(where, f"the range [{lo}, {hi}] with step {step} is not finite; use finite bounds "
                                    "and a larger step")
        count = math.floor(span + 1e-9) + 1
    if count > MAX_VALUES:
        amount = str(count) if count < 10**15 else f"about 10^{len(str(count)) - 1}"
        raise SpaceError(where, f"the range has {amount} values, more than the supported {MAX_VALUES}; "
                                "use a larger step")
    if ptype == "integer":
        return list(range(lo, hi + 1, step))
    # Round away the float noise of lo + k*step so that 0.1 + 2*0.1 reads back as 0.3.
    return [float(round(lo + k * step, 12)) for k in range(count)]


def parse_parameter(spec: Any, index: int) -> Parameter:
    """Build a `Parameter` from one CRD-shaped dict; ``index`` is its position (for error paths)."""
    where = f"parameters[{index}]"
    if not isinstance(spec, dict):
        raise SpaceError(where, f"expected an object with name and type, got {type(spec).__name__}")
    # pydantic's model_dump() writes unset optional fields as None: treat them as absent.
    spec = {k: v for k, v in spec.items() if v is not None}
    name = check_name(spec.get("name"), f"{where}.name")
    ptype = spec.get("type")
    if not isinstance(ptype, str) or ptype not in TYPES:
        word = ptype.lower() if isinstance(ptype, str) else ""
        hint = did_you_mean(_TYPE_HINTS.get(word, word), TYPES)  # an alias is a type's exact name
        msg = f"unknown type {ptype!r} for parameter {name!r}; expected one of {', '.join(TYPES)}"
        raise SpaceError(f"{where}.type", msg + hint)
    unknown = set(spec) - _COMMON_KEYS - _ALLOWED_KEYS[ptype]
    if unknown:
        allowed = sorted(_COMMON_KEYS | _ALLOWED_KEYS[ptype])
        raise SpaceError(f"{where}.{sorted(unknown)[0]}",
                         f"not a field of a {ptype} parameter ({name!r}); allowed: {', '.join(allowed)}")

    size = None
    if ptype == "boolean":
        values: list[Any] = [False, True]
    elif ptype == "permutation":
        size = spec.get("size")
        if not _is_int(size) or not 1 <= size <= MAX_PERMUTATION_SIZE:
            raise SpaceError(f"{where}.size", f"a permutation needs an integer 'size' from 1 to "
                                              f"{MAX_PERMUTATION_SIZE}, got {size!r}")
        values = [tuple(p) for p in itertools.permutations(range(size))]
    elif ptype in ("integer", "real") and "range" in spec:
        if "values" in spec:
            raise SpaceError(where, f"give either 'range' or 'values' for {name!r}, not both")
        values = _range_values(spec["range"], ptype, f"{where}.range")
    elif "values" in spec:
        values = _values_list(spec["values"], f"{where}.values")
        for i, v in enumerate(values):
            ok = {"integer": _is_int, "ordinal": _is_number, "real": _is_number}.get(
                ptype, lambda x: isinstance(x, (str, bool)) or _is_number(x))(v)
            if not ok:
                want = {"integer": "an integer", "ordinal": "a number", "real": "a number"}.get(
                    ptype, "a string, number or boolean")
                raise SpaceError(f"{where}.values[{i}]", f"expected {want}, got {v!r}")
        if ptype == "real":
            values = [float(v) for v in values]
        _check_unique(ptype, values, f"{where}.values")
    else:
        need = "'range' (or 'values')" if ptype in ("integer", "real") else "'values'"
        raise SpaceError(where, f"{ptype} parameter {name!r} needs {need}")

    scale = spec.get("scale")
    if scale is not None and ptype not in NUMERIC_TYPES:
        raise SpaceError(f"{where}.scale", f"'scale' only applies to numeric parameters, not {ptype}")
    if scale is None:
        scale = "log" if ptype == "ordinal" and is_power_of_two_list(tuple(values)) else "linear"
    elif scale not in SCALES:
        raise SpaceError(f"{where}.scale", f"unknown scale {scale!r}; expected 'linear' or 'log'")
    if scale == "log" and any(v <= 0 for v in values):
        raise SpaceError(f"{where}.scale", f"a log scale needs positive values; {name!r} has {min(values)!r}")

    param = Parameter(name=name, type=ptype, values=tuple(values), scale=scale, size=size, spec=spec)
    if "default" in spec:
        default = spec["default"]
        idx = param.index_of(default)
        if idx is None:
            raise SpaceError(f"{where}.default", f"default {default!r} is not one of the values of {name!r}")
        param = Parameter(name=name, type=ptype, values=param.values, scale=scale, size=size,
                          default=param.values[idx], has_default=True, spec=spec)
    return param
