"""Search strategies and the Study the operator drives.

``Study(space, strategy="bayes", seed=0, options=...)`` answers ``suggest(n, pending=...)``
and takes ``observe(config, outcome, objective, times)``; strategies are ``random``,
``genetic`` and ``bayes`` (the default: GP surrogate + feasibility model, LogEI x
P(feasible)). Each strategy declares its few public options (`describe_options`), and
checks them (`validate_options`: a former option is refused naming it, `removed_options`);
its internal knobs (`describe_tuning`) only a development caller sets (``Study(...,
tuning=...)``, `split_settings`). `pool_verdict` holds the rules that end a pool's round of tuning.
See docs/decisions.md and docs/reference/strategy-options.md.
"""

from .options import Option, OptionError, StrategyOptions, Tuning, UnknownStrategyError
from .problem import Candidates, History
from .stopping import Budget, Progress, Verdict, pool_verdict, stop_reason
from .strategy import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    Strategy,
    describe_options,
    describe_tuning,
    removed_options,
    split_settings,
    validate_options,
)
from .study import Study

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "Budget",
    "Candidates",
    "History",
    "Option",
    "OptionError",
    "Progress",
    "Strategy",
    "StrategyOptions",
    "Study",
    "Tuning",
    "UnknownStrategyError",
    "Verdict",
    "describe_options",
    "describe_tuning",
    "pool_verdict",
    "removed_options",
    "split_settings",
    "stop_reason",
    "validate_options",
]
