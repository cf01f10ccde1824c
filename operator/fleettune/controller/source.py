"""A user kernel's source as the run last read it from its ConfigMap (pure).

Trials carry the SHA-256 of the source the operator checked, so the job refuses a mount
that changed since. A source that failed the checks is remembered by its digest: the run
waits for it to change rather than compiling it again at every read.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from fleettune.api import TuningRunSpec
from fleettune.kernelcheck import check_source_data

SOURCE_RECHECK_S = 15.0


class KernelSource:
    def __init__(self) -> None:
        self.text: str | None = None
        self.digest: str | None = None  # kept in the status: survives a restart
        self.failed: str | None = None  # the digest of a source that did not compile
        self.read_at = -SOURCE_RECHECK_S

    def reset(self) -> None:
        """A new spec generation: read and check the source again."""
        self.text, self.failed, self.read_at = None, None, -SOURCE_RECHECK_S

    def due(self, mono: float) -> bool:
        return mono - self.read_at >= SOURCE_RECHECK_S

    def changed(self) -> None:
        """Its ConfigMap changed: read it again at the next step."""
        self.read_at = -SOURCE_RECHECK_S

    def read(self, spec: TuningRunSpec, data: Mapping[str, str] | None, mono: float) -> bool:
        """Take the ConfigMap's data as just read (None: no such ConfigMap); raises
        KernelSpecError naming the field when the source is missing. True when the source
        differs from the one the run tuned or checked before."""
        self.read_at = mono
        try:
            text = check_source_data(spec, data)
        except Exception:
            self.text = None
            raise
        digest = hashlib.sha256(text.encode()).hexdigest()
        edited = self.digest is not None and digest != self.digest
        self.text, self.digest = text, digest
        return edited

    def waiting(self, spec: TuningRunSpec, error: str | None, kept: int | None = None) -> str:
        """What a run without its source says while it waits for it: the read's error,
        the ConfigMap and key it waits for, and (`kept`: mid-run) that its results stay."""
        source = spec.kernel.user
        assert source is not None
        message = f"{error or 'the kernel source is not read yet'}; waiting for ConfigMap {source.config_map!r} " \
                  f"key {source.key!r}"
        if kept is None:
            return message
        return f"{message}: no new trial starts until it is back; the {kept} result(s) measured so far are kept"

    @property
    def broken(self) -> bool:
        """The source as it is now failed to compile."""
        return self.failed is not None and self.failed == self.digest
