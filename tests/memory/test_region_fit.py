"""The region entry's memory check over the memory views (krexd.memory.region_fit).

Every region entry asks it before freezing siblings.  It answers from the
shim's counts read at that moment (one read of the registrations) over each
tenant's last full record, and pays a full re-read only when that does not
fit, so a sibling that freed memory since is still seen at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from krexd.memory.region_fit import RegionMemoryCheck
from krexd.tenancy.tenants import TenantRegistry
from tests.support.fakes import make_tenant

G = 1 << 30


@dataclass
class _View:
    total: int = 80 * G
    other: int = 0


@dataclass
class _Views:
    """The three calls RegionMemoryCheck makes of the memory views (krexd.memory.views)."""

    counts: dict[int, int] = field(default_factory=dict)
    after_refresh: dict[Any, int] = field(default_factory=dict)  # tenant -> used_bytes
    refreshes: int = 0
    unread: bool = False  # before the first device read: no view

    def shim_counts(self, gpu: int) -> dict[int, int]:
        return dict(self.counts)

    def refresh(self, gpu: int | None = None) -> None:
        self.refreshes += 1
        for t, used in self.after_refresh.items():
            t.memory.used_bytes = used

    def view(self, gpu: int) -> _View | None:
        return None if self.unread else _View()


def _rig(n: int) -> tuple[RegionMemoryCheck, _Views, list[Any]]:
    registry = TenantRegistry()
    tenants = [make_tenant(registry) for _ in range(n)]
    mon = _Views()
    return RegionMemoryCheck(10.0, mon), mon, tenants  # type: ignore[arg-type]


def test_a_fitting_entry_reads_only_the_shim_counts() -> None:
    check, mon, (holder, a, b) = _rig(3)
    a.memory.used_bytes, b.memory.used_bytes = 10 * G, 20 * G
    holder.memory.learned_bytes = 30 * G
    fit = check.check(holder, [a, b])
    assert fit is not None and fit.fits and fit.siblings == 30 * G
    assert mon.refreshes == 0


def test_counts_read_now_are_charged_when_larger_than_the_record() -> None:
    check, mon, (holder, a) = _rig(2)
    a.memory.used_bytes = 10 * G
    mon.counts = {a.id: 40 * G, holder.id: 5 * G}  # allocated since the last full read
    fit = check.check(holder, [a])
    assert fit is not None and fit.siblings == 40 * G and fit.need == 5 * G


def test_a_stale_record_that_does_not_fit_is_read_again_in_full() -> None:
    check, mon, (holder, a) = _rig(2)
    a.memory.used_bytes = 70 * G  # as of the last full read
    holder.memory.learned_bytes = 20 * G
    mon.after_refresh = {a: 30 * G}  # it freed 40 GiB since
    fit = check.check(holder, [a])
    assert mon.refreshes == 1
    assert fit is not None and fit.fits and fit.siblings == 30 * G


def test_before_the_first_device_read_there_is_no_check() -> None:
    check, mon, (holder, a) = _rig(2)
    mon.unread = True
    assert check.check(holder, [a]) is None
    assert mon.refreshes == 0
