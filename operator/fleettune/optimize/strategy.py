"""The interface every search strategy implements, and the strategies by name."""

from __future__ import annotations

import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ClassVar, TypedDict

import numpy as np

from fleettune.names import did_you_mean

from .options import Option, OptionError, StrategyOptions, Tuning, UnknownStrategyError
from .problem import Candidates, History


class Strategy(ABC):
    """Chooses candidate numbers. Must be a pure function of (seed, history, pending):

    the operator rebuilds studies from stored results after a restart and must get the
    same next suggestions, so no hidden state may depend on the call sequence (caches
    keyed by the history are fine).

    Options: a strategy declares them as a `StrategyOptions` subclass in ``Options``;
    ``self.options`` is that class resolved from the given values (defaults for the
    others), and constructing a strategy with an unknown or invalid option raises
    `OptionError`. Its internal knobs are declared the same way in ``Tuning`` (defaults:
    the constants of the modules that use them) and resolved into ``self.tuning`` from
    ``tuning``: a development hook (benchmarks that flip a heuristic, tests that fit
    faster) that the operator never passes.
    """

    name: ClassVar[str] = "?"
    Options: ClassVar[type[StrategyOptions]] = StrategyOptions
    Tuning: ClassVar[type[StrategyOptions]] = Tuning
    # Whether suggestions depend on the results observed: a batch of such a strategy's
    # suggestions, chosen before any of them is measured, is worse than the same number
    # chosen one at a time (the operator ramps batched Pods up for it, `slow_start`).
    learns: ClassVar[bool] = True

    def __init__(
        self, candidates: Candidates, seed: int, options: Mapping[str, Any] | None = None,
        tuning: Mapping[str, Any] | None = None,
    ) -> None:
        self.candidates = candidates
        self.seed = int(seed)
        self.options: StrategyOptions = self.Options.resolve(self.name, options)
        self.tuning: StrategyOptions = self.Tuning.resolve(self.name, tuning)
        # Wall time of the model fits of the current (or last) `propose`, None when it
        # fitted nothing: a measurement for the operator's metrics, never an input.
        self.fit_seconds: float | None = None
        self._fit_depth = 0

    def rng(self, history: History, pending: np.ndarray, salt: int = 0) -> np.random.Generator:
        """A generator that depends only on the state, never on how often we were called."""
        return np.random.default_rng([self.seed, len(history), len(pending), salt, 0x5EED])

    @contextmanager
    def fitting(self) -> Iterator[None]:
        """Count the wall time of the block as model fitting in ``fit_seconds`` (a block
        inside another counts once, with the outer one)."""
        self._fit_depth += 1
        start = time.perf_counter()
        try:
            yield
        finally:
            self._fit_depth -= 1
            if self._fit_depth == 0:
                self.fit_seconds = (self.fit_seconds or 0.0) + time.perf_counter() - start

    def order_prior(self, first: np.ndarray) -> None:
        """Candidates of the warm-start data to measure first, in this order (`Study`'s
        ``prior_first``); a strategy without a warm start ignores them."""
        return None

    def prior_dropped_after(self, history: History) -> int | None:
        """Evaluations without improvement after which the strategy stopped using the
        warm-start data (task 0) of ``history``; None while it uses them, or if it never
        drops them."""
        return None

    def prior_weight(self, history: History) -> float | None:
        """How much of the warm-start data's shape the strategy's model uses now, in [0, 1]
        (0 once dropped); None for a strategy that does not weigh it, or without any."""
        return None

    @abstractmethod
    def propose(self, n: int, history: History, pending: np.ndarray, available: np.ndarray) -> np.ndarray:
        """``n`` distinct candidate numbers among ``available`` (a boolean mask) that are
        not in ``pending``; fewer only if fewer are available."""


def take_random(rng: np.random.Generator, available: np.ndarray, n: int) -> np.ndarray:
    idx = np.flatnonzero(available)
    if len(idx) <= n:
        return rng.permutation(idx)
    return rng.choice(idx, size=n, replace=False)


class _Strategies(Mapping[str, type[Strategy]]):
    """Strategy classes by name, each imported when first asked for: ``bayes`` brings in
    torch (about 0.5 GiB resident), which an operator whose runs use ``random`` or
    ``genetic`` should not pay for."""

    _where: ClassVar[dict[str, tuple[str, str]]] = {
        "bayes": ("bayes", "BayesOpt"), "random": ("random_search", "RandomSearch"), "genetic": ("genetic", "Genetic"),
    }

    def __getitem__(self, name: str) -> type[Strategy]:
        module, cls = self._where[name]
        found: type[Strategy] = getattr(importlib.import_module(f".{module}", __package__), cls)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


STRATEGIES: Mapping[str, type[Strategy]] = _Strategies()
DEFAULT_STRATEGY = "bayes"


def strategy_class(name: str) -> type[Strategy]:
    """The strategy called ``name``; UnknownStrategyError if there is none."""
    if name not in STRATEGIES:
        raise UnknownStrategyError(name, list(STRATEGIES))
    return STRATEGIES[name]


def validate_options(strategy: str, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Strategy ``strategy``'s options: its defaults updated with ``options``.

    Raises `OptionError` (a ValueError with the option's name in ``key``; the message
    does not name it) for an unknown option, listing the known ones, or a value the
    option does not accept, and `UnknownStrategyError` for an unknown strategy.
    """
    return strategy_class(strategy).Options.resolve(strategy, options).as_dict()


def describe_options(strategy: str) -> tuple[Option, ...]:
    """Strategy ``strategy``'s options, in declaration order: name, default, doc and
    accepted values (``expected``), for documentation and command lines."""
    return strategy_class(strategy).Options.declared()


def removed_options(strategy: str) -> Mapping[str, str]:
    """Strategy ``strategy``'s former options, each with what replaced it."""
    return strategy_class(strategy).Options.removed


def describe_tuning(strategy: str) -> tuple[Option, ...]:
    """Strategy ``strategy``'s internal knobs (its ``Tuning``), as `describe_options`."""
    return strategy_class(strategy).Tuning.declared()


class Settings(TypedDict):
    """`Study`'s ``options`` and ``tuning`` keywords (`split_settings`)."""

    options: dict[str, Any]
    tuning: dict[str, Any]


def split_settings(strategy: str, settings: Mapping[str, Any] | None) -> Settings:
    """Development: ``settings``, options and tuning knobs in one mapping (a benchmark's
    ``--option``/``--variant``), as `Study`'s ``options`` and ``tuning`` keywords, each
    checked: `OptionError` for a key that is neither (a removed option named as such, unless
    a knob kept its name) or a value not accepted."""
    cls = strategy_class(strategy)
    public, knobs = {o.name for o in cls.Options.declared()}, {o.name for o in cls.Tuning.declared()}
    given = dict(settings or {})
    for key in given:
        if key not in public | knobs | set(cls.Options.removed):
            hint = did_you_mean(str(key), public | knobs)
            names = [", ".join(sorted(group)) or "none" for group in (public, knobs)]
            known = f"options: {names[0]}; tuning knobs: {names[1]}"
            raise OptionError(key, f"neither an option nor a tuning knob of strategy {strategy!r}{hint} ({known})")
    tuning = {k: v for k, v in given.items() if k in knobs}
    options = {k: v for k, v in given.items() if k not in knobs}
    cls.Options.resolve(strategy, options)
    cls.Tuning.resolve(strategy, tuning)
    return Settings(options=options, tuning=tuning)
