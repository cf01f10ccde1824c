"""The one error type of the search-space library.

Every problem with user input (a TuningRun spec, a constraint, a recorded file) is reported as a
`SpaceError` that names *where* it is (a field path such as ``parameters[2].values`` or
``constraints[1]``) and, for expressions, the column and the offending snippet, so that the
operator can put it verbatim into the run's status condition.
"""

from __future__ import annotations


class SpaceError(ValueError):
    """Invalid search-space input. ``str(err) == "<field>: <message>[ (at column N: '<snippet>')]"``.

    ``position`` is a 1-based column into the expression named by ``field`` (None when the error
    is not about a place in an expression).
    """

    def __init__(self, field: str, message: str, position: int | None = None, snippet: str | None = None):
        self.field = field
        self.message = message
        self.position = position
        self.snippet = snippet
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.field}: {self.message}"
        if self.position is not None:
            if self.snippet:
                text += f" (at column {self.position}: '{self.snippet}')"
            else:
                text += f" (at column {self.position})"
        return text

    def __reduce__(self):  # keep the structured fields across pickling (executors, multiprocessing)
        return (type(self), (self.field, self.message, self.position, self.snippet))
