"""Search strategies and the Study the operator drives (issue 4).

``Study(space, strategy="bayes", seed=0)`` answers ``suggest(n, pending=...)`` and takes
``observe(config, outcome, objective, times)``; strategies are ``random``, ``genetic``
and ``bayes`` (the default: GP surrogate + feasibility model, LogEI x P(feasible)).
"""

from .problem import Candidates, History
from .stopping import stop_reason
from .strategy import Strategy
from .study import DEFAULT_STRATEGY, STRATEGIES, Study, strategy_options

__all__ = [
    "DEFAULT_STRATEGY", "STRATEGIES", "Candidates", "History", "Strategy", "Study", "stop_reason", "strategy_options",
]
