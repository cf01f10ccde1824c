"""Strategy options as data: each strategy declares its options, with their defaults,
what they do and which values they accept, as a frozen dataclass (`StrategyOptions`).

The declaration is the one place an option exists: the strategy reads the resolved,
typed object (``self.options.initial``), the operator validates a TuningRun's
``spec.strategy.options`` against it (`fleettune.optimize.validate_options`), and the
documentation and the command line list it (`fleettune.optimize.describe_options`).

Declaring an option::

    @dataclass(frozen=True)
    class MyOptions(StrategyOptions):
        initial: int = integer(10, "size of the space-filling design")

The public options are few: what a user would set, each with its measured effect in its
doc. A strategy's internal knobs are constants of the module that uses them, gathered in
a second declaration of the same kind (the strategy's ``Tuning``, e.g. `BayesTuning`)
that only a development caller sets (`Study`'s ``tuning``: benchmarks, tests); a
TuningRun cannot. A former option stays in ``removed`` with what became of it, so that a
run that still sets it is refused naming it rather than silently tuned otherwise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any, ClassVar, Self

from fleettune.names import did_you_mean

_OPTION = "fleettune.option"  # dataclass field metadata key: the field's `_Check`


class OptionError(ValueError):
    """A strategy option that does not exist or has a value the option does not accept.

    ``key`` is the option's name; ``str(error)`` says what is wrong without naming it, so
    that the caller can prefix where the option came from (``spec.strategy.options.<key>:``).
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


class UnknownStrategyError(ValueError):
    """A strategy name that is not one of `fleettune.optimize.STRATEGIES`."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"{name!r} is not a strategy (strategies: {', '.join(sorted(known))})")
        self.name = name


@dataclass(frozen=True)
class Option:
    """One option of a strategy, as documentation and validation see it."""

    name: str
    default: Any
    doc: str
    expected: str  # the values it accepts, in words ("an integer >= 1")
    accepts: Callable[[Any], bool] = field(repr=False, compare=False)
    # Read only by a study with warm-start data: a cold study behaves the same whatever
    # its value (tests/unit/optimize/test_strategy_options.py checks it), so a benchmark
    # of a warm-start setting need not run the cold studies again.
    warm_only: bool = False

    def check(self, value: Any) -> Any:
        """``value`` if the option accepts it; OptionError otherwise."""
        if not self.accepts(value):
            raise OptionError(self.name, f"expected {self.expected}, got {value!r}")
        return value


@dataclass(frozen=True)
class _Check:
    doc: str
    expected: str
    accepts: Callable[[Any], bool]
    warm_only: bool


def _declare(default: Any, doc: str, expected: str, accepts: Callable[[Any], bool], warm_only: bool) -> Any:
    return field(default=default, metadata={_OPTION: _Check(doc, expected, accepts, warm_only)})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ``warm_only``: the option is read only by a study with warm-start data (`Option.warm_only`).


def integer(default: int, doc: str, *, low: int = 1, warm_only: bool = False) -> Any:
    """An integer option of at least ``low`` (0 where 0 switches a behaviour off)."""
    return _declare(default, doc, f"an integer >= {low}", lambda v: _is_int(v) and v >= low, warm_only)


def positive(default: float | None, doc: str, *, warm_only: bool = False) -> Any:
    """A finite positive number (int or float); a default of None means "automatic"."""
    return _declare(default, doc, "a positive number", lambda v: _is_number(v) and v > 0, warm_only)


def non_negative(default: float, doc: str, *, warm_only: bool = False) -> Any:
    """A finite number >= 0 (0 where it switches a behaviour off)."""
    return _declare(default, doc, "a number >= 0", lambda v: _is_number(v) and v >= 0, warm_only)


def boolean(default: bool, doc: str, *, warm_only: bool = False) -> Any:
    return _declare(default, doc, "a boolean", lambda v: isinstance(v, bool), warm_only)


@dataclass(frozen=True)
class StrategyOptions:
    """The options of a strategy: subclasses declare them as fields made with `integer`,
    `positive`, `non_negative` or `boolean`. The base class has none.

    ``removed``: former options, each with what replaced it ("it is now fixed at 40"):
    given one, `resolve` refuses it by name. ``noun``: what the fields are called in
    errors ("option"; "tuning knob" for a strategy's ``Tuning``)."""

    removed: ClassVar[Mapping[str, str]] = {}
    noun: ClassVar[str] = "option"

    @classmethod
    def declared(cls) -> tuple[Option, ...]:
        """The options, in declaration order."""
        out = []
        for f in fields(cls):
            check: _Check = f.metadata[_OPTION]
            default = None if f.default is MISSING else f.default
            out.append(Option(f.name, default, check.doc, check.expected, check.accepts, check.warm_only))
        return tuple(out)

    @classmethod
    def resolve(cls, strategy: str, given: Mapping[str, Any] | None = None) -> Self:
        """The defaults updated with ``given``, each value checked: OptionError names the
        first unknown option (with the closest known one, and listing them all) or value not
        accepted."""
        declared = {o.name: o for o in cls.declared()}
        a = "an" if cls.noun[0] in "aeiou" else "a"
        values = {}
        for key, value in (given or {}).items():
            if key in cls.removed:
                raise OptionError(key, f"no longer {a} {cls.noun}: {cls.removed[key]}")
            if key not in declared:
                known = ", ".join(sorted(declared)) or "none"
                hint = did_you_mean(str(key), declared)
                raise OptionError(key, f"not {a} {cls.noun} of strategy {strategy!r}{hint} ({cls.noun}s: {known})")
            values[key] = declared[key].check(value)
        return cls(**values)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Tuning(StrategyOptions):
    """A strategy's internal knobs, declared as options are (the base class has none):
    defaults are the constants of the modules that use them, and only a development caller
    sets them (`Study`'s ``tuning``)."""

    noun: ClassVar[str] = "tuning knob"


def fixed(tuning: type[StrategyOptions]) -> dict[str, str]:
    """``removed`` entries for former options that are now ``tuning``'s knobs: each is
    fixed, for a TuningRun, at the knob's default."""
    return {o.name: f"it is now fixed at {json.dumps(o.default)}" for o in tuning.declared()}
