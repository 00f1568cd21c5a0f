"""``Gate``: one GPU's gate as krexd holds it: the gate word, steps 2, 3 and 8."""

from __future__ import annotations

import ctypes
import errno
import os
import time
from collections.abc import Callable, Iterable

from krexd.gate.binding import MAX_SLOTS, PendingC, check_id
from krexd.gate.errors import GateBusy, GateError, GateStale, GateTimeout
from krexd.gate.readback import RegistrationInfo
from krexd.gate.registration_memory import GateRegistrationMemory

# The first slice of a drain before pending owners are judged (s), then the
# period of judgements while a drain waits: doubling from the first to the
# last (an owner gone late in a long wait is seen within 40 ms, and a drain
# waiting out a stuck tenant wakes about 30 times in a second, not 200).
_FIRST_JUDGE_S = 0.001
_JUDGE_PERIOD_S = 0.005
_JUDGE_PERIOD_MAX_S = 0.04


class Gate(GateRegistrationMemory):
    """One GPU's gate as krexd holds it.  Build with :meth:`create`.

    ``judge`` (optional) verifies the owners of registrations still pending
    in a drain; those it rejects are skipped from then on (:meth:`ignore`).
    """

    # -- the region protocol ---------------------------------------------

    def close(self, holder: int, epoch: int) -> None:
        """Step 2: close the gate for tenant ``holder`` with a new ``epoch`` (both > 0).

        Raises GateBusy when the gate is not open.
        """
        check_id("holder", holder)
        check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_coord_close(h, holder, epoch)
        if rc == -errno.EBUSY:
            raise GateBusy(f"gate {self.path} is not open (held: {self.word})", errno.EBUSY)
        if rc != 0:
            raise GateError(f"close of gate {self.path}: {os.strerror(-rc)}", -rc)

    def drain(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        settled: Callable[[set[int]], Iterable[int]] | None = None,
    ) -> None:
        """Step 3: block until every sibling registration acknowledged ``epoch``, idle.

        Siblings are the active and exiting slots of attached tenants other
        than ``holder`` (an exiting one needs no acknowledgement, only nothing
        in flight); owners that :attr:`judge` rejects (gone, exec'd, not the
        tenant's) are skipped.  Raises GateTimeout (with ``pending``) after
        ``timeout_s`` seconds, GateStale if the gate no longer holds
        (holder, epoch).  Blocks without the GIL: call it from a worker
        thread.

        ``settled(pending)``, if given, is called in this thread when the
        first scan finds a registration pending and after each change of
        the set of tenants (ids) that still have pending registrations,
        with that set: every other tenant has drained.  It returns the
        tenants it took (krexd froze them): their registrations are not
        waited for from then on.  What it raises ends the drain.
        """
        check_id("holder", holder)
        check_id("epoch", epoch)
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, not {timeout_s}")
        start = time.monotonic()
        deadline = start + timeout_s
        # Without a judge nothing is done between the C waits: one wait to the deadline.
        judge_at = start + _FIRST_JUDGE_S if self.judge is not None else deadline
        period = _JUDGE_PERIOD_S
        skip: list[int] = []
        seen = ctypes.c_uint64(0)  # the fingerprint of the pending tenants last seen
        # Room for every slot there can be: a truncated list would hide a pending tenant.
        buf = (PendingC * MAX_SLOTS)()
        while True:
            now = time.monotonic()
            last = deadline <= judge_at
            left = max(0.0, min(deadline, judge_at) - now)
            timed = self._wait(holder, epoch, left, skip, seen, buf)
            if timed is None:
                return
            expired, pending = timed
            if settled is not None:
                skip.extend(settled({p[0] for p in pending}))
            if not expired:
                continue  # a tenant drained (or came): wait again for the rest
            slots = self._judged(self._pending_registrations(pending))
            if last and slots:
                raise GateTimeout(
                    f"gate {self.path}: {len(slots)} registration(s) not drained for "
                    f"epoch {epoch} after {timeout_s:g} s",
                    slots,
                )
            judge_at = time.monotonic() + period
            period = min(_JUDGE_PERIOD_MAX_S, period * 2)

    def _judged(self, slots: list[RegistrationInfo]) -> list[RegistrationInfo]:
        """The pending ``slots`` whose owners :attr:`judge` accepts; the others are ignored."""
        if self.judge is None:
            return slots
        alive = []
        for s in slots:
            if self.judge(s):
                alive.append(s)
            else:
                self.ignore(s)
        return alive

    def _wait(
        self,
        holder: int,
        epoch: int,
        timeout_s: float,
        skip: list[int],
        seen: ctypes.c_uint64,
        pending: ctypes.Array[PendingC],
    ) -> tuple[bool, list[tuple[int, int, int]]] | None:
        """One C wait (``krex_coord_wait_change``) into ``pending``; None when drained.

        Else (timed out, the pending (tenant, index, owner)): it returns
        early, not timed out, when the set of pending tenants differs from
        ``seen``'s fingerprint (updated).  The tenants in ``skip`` are not
        waited for.
        """
        npending = ctypes.c_uint32(0)
        skipped = (ctypes.c_uint32 * max(1, len(skip)))(*skip)
        timeout_ns = min(int(timeout_s * 1e9), 2**62)
        with self._mapped() as h:
            rc = self._lib.krex_coord_wait_change(
                h,
                holder,
                epoch,
                skipped,
                len(skip),
                timeout_ns,
                ctypes.byref(seen),
                pending,
                len(pending),
                ctypes.byref(npending),
            )
        if rc == 0:
            return None
        if rc in (1, -errno.ETIMEDOUT):
            found = [(p.tenant, p.index, p.owner) for p in pending[: npending.value]]
            return rc != 1, found
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} no longer holds tenant {holder} epoch {epoch}", errno.ESTALE
            )
        raise GateError(f"drain on gate {self.path}: {os.strerror(-rc)}", -rc)

    def _pending_registrations(self, pending: list[tuple[int, int, int]]) -> list[RegistrationInfo]:
        """The snapshots of the pending registrations still owned as they were pending."""
        want = set(pending)
        return [s for s in self.registrations() if (s.tenant, s.index, s.owner) in want]

    def wait_drained(self, holder: int, epoch: int, timeout_s: float) -> list[RegistrationInfo]:
        """:meth:`drain`, then the sibling registrations that acknowledged ``epoch``."""
        self.drain(holder, epoch, timeout_s)
        return [
            s
            for s in self.registrations()
            if s.state == "active" and s.tenant != holder and s.ack_epoch == epoch
        ]

    def reopen(self, holder: int, epoch: int) -> None:
        """Step 8: reopen the gate if it still holds (holder, epoch).

        Raises GateStale otherwise (a late recovery of an older region).
        """
        check_id("holder", holder)
        check_id("epoch", epoch)
        with self._mapped() as h:
            rc = self._lib.krex_coord_reopen(h, holder, epoch)
        if rc == -errno.ESTALE:
            raise GateStale(
                f"gate {self.path} does not hold tenant {holder} epoch {epoch} (held: {self.word})",
                errno.ESTALE,
            )
        if rc != 0:
            raise GateError(f"reopen of gate {self.path}: {os.strerror(-rc)}", -rc)

    # -- the gate word and epoch ---------------------------------------------

    @property
    def epoch(self) -> int:
        """The last epoch krexd requested on this gate (acknowledgements after it are forged)."""
        with self._mapped() as h:
            return int(self._lib.krex_coord_epoch(h))

    def set_epoch(self, epoch: int) -> None:
        """Seed :attr:`epoch` (after a restart: the epochs krexd continues from)."""
        with self._mapped() as h:
            self._lib.krex_coord_set_epoch(h, epoch & 0xFFFF_FFFF)

    @property
    def drain_scans(self) -> int:
        """Scans the drain's wait made on this gate so far (each wake-up is one; statistics)."""
        with self._mapped() as h:
            return int(self._lib.krex_coord_drain_scans(h))

    @property
    def word(self) -> tuple[int, int] | None:
        """``(holder, epoch)`` while the gate is closed, None while it is open."""
        with self._mapped() as h:
            w = int(self._lib.krex_coord_word(h))
        return None if w == 0 else (w & 0xFFFF_FFFF, w >> 32)
