"""The gate's errors: ``GateError`` and the refusals the protocol names."""

from __future__ import annotations

import errno

from krexd.gate.readback import RegistrationInfo


class GateError(Exception):
    """A gate operation failed (bad file, wrong version, refused transition)."""

    def __init__(self, message: str, err: int = 0) -> None:
        super().__init__(message)
        self.errno = err


class GateBusy(GateError):
    """``close`` on a gate that is not open (another region holds it)."""


class GateStale(GateError):
    """The gate no longer holds the (holder, epoch) the caller named."""


class GateTimeout(GateError):
    """``drain`` ran out of time; ``pending`` lists the undrained registrations."""

    def __init__(self, message: str, pending: list[RegistrationInfo]) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.pending = pending

    def describe(self) -> str:
        """The pending registrations in words: ``pid 1234 (tenant 5, inflight 1, ack 6)``."""
        parts = [
            f"pid {s.pid} (tenant {s.tenant}, slot {s.index}, inflight {s.inflight}, "
            f"ack {s.ack_epoch})"
            for s in self.pending
        ]
        return ", ".join(parts) or "none"
