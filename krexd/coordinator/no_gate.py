"""The gate of a GPU without ``libkrex_gate.so``: the same port, no steps.

The coordinator holds one instead of ``None``, so the protocol's steps read
the same with and without a gate (submissions are then not gated; freezing
and pinning still apply).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from krexd.gate import RegistrationInfo


class NoGate:
    """The :class:`krexd.coordinator.isolation.RegionGate` of a GPU without ``libkrex_gate.so``:
    nothing to close, drain or reopen, no registrations."""

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: nothing to close."""

    def drain(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> None:
        """Step 3: nothing to wait for, and ``settled`` is not called (as a real drain
        with nothing pending does not call it): each sibling is frozen in step 4."""

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: nothing to reopen."""

    def registrations(self) -> list[RegistrationInfo]:
        """No registrations."""
        return []
