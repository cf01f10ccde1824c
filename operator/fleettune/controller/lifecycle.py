"""A pool's lifecycle: its phases and the moves between them (pure).

A pool is *Pending* until its search is built (or while the target's earlier problem
sizes tune); *Unschedulable* while no eligible node matches it; *Running* while it has
budget; *Succeeded* or *Failed* when done. Only a new round (driver change, re-tune, a
changed search space or kernel source), a larger budget or a fixed kernel source
re-opens a finished pool. Every phase change goes through `PoolPhase.to`, so a move the
loop never means to make fails loudly in the tests instead of showing up as a strange
status.
"""

from __future__ import annotations

from enum import StrEnum


class PoolPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    UNSCHEDULABLE = "Unschedulable"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def done(self) -> bool:
        return self in (PoolPhase.SUCCEEDED, PoolPhase.FAILED)

    def to(self, new: PoolPhase) -> PoolPhase:
        """The phase after moving to `new`; raises IllegalTransition for a move the lifecycle has not."""
        if new != self and new not in TRANSITIONS[self]:
            raise IllegalTransition(f"a pool cannot go from {self} to {new}")
        return new


class IllegalTransition(RuntimeError):
    pass


_P = PoolPhase
TRANSITIONS: dict[PoolPhase, frozenset[PoolPhase]] = {
    # Failed from Pending: its search space cannot be built.
    _P.PENDING: frozenset({_P.RUNNING, _P.UNSCHEDULABLE, _P.FAILED}),
    # Done from Unschedulable: a pool whose nodes went away still counts its budget and deadline.
    _P.UNSCHEDULABLE: frozenset({_P.RUNNING, _P.PENDING, _P.SUCCEEDED, _P.FAILED}),
    # Pending from Running: a kernel source that did not compile was fixed.
    _P.RUNNING: frozenset({_P.SUCCEEDED, _P.FAILED, _P.UNSCHEDULABLE, _P.PENDING}),
    # Only a new round, a larger budget or a fixed source re-opens a finished pool.
    _P.SUCCEEDED: frozenset({_P.RUNNING, _P.PENDING}),
    _P.FAILED: frozenset({_P.RUNNING, _P.PENDING}),
}
