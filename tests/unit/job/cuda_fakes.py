"""Stand-ins for cupy's exception classes: the job classifies errors by these class names."""

from __future__ import annotations


class CompileException(Exception):
    def get_message(self) -> str:
        return str(self.args[0])


class CUDADriverError(RuntimeError):
    pass


class CUDARuntimeError(RuntimeError):
    pass
