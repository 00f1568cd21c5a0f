"""A sibling that cannot be thawed does not wedge its GPU.

The coordinator is driven in-process with real cgroups and processes; one
sibling's thaw is made to fail.  The region must still end: the other
siblings thawed, the gate reopened, the lock free for the next region.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable

import pytest

from krexd.cgroups import CgroupError
from krexd.tenancy import states
from tests.coordinator.conftest import OneGpu

pytestmark = [pytest.mark.root]


def test_failed_thaw_of_one_sibling_still_ends_the_region(
    one_gpu: Callable[[int], OneGpu],
) -> None:
    g = one_gpu(3)
    holder, stuck, other = g.tenants
    g.admit(holder, stuck, other)
    coord = g.coordinator()

    def refuse() -> None:
        raise CgroupError(errno.EIO, "thaw refused")

    async def scenario() -> None:
        grant = await coord.enter(holder, g.pid(holder), g.pid(holder))
        assert stuck.cgroup.is_frozen() and other.cgroup.is_frozen()
        real_thaw = stuck.cgroup.thaw
        stuck.cgroup.thaw = refuse  # type: ignore[method-assign]
        try:
            await coord.exit(holder, grant["epoch"], 0.0, 0)
        finally:
            stuck.cgroup.thaw = real_thaw  # type: ignore[method-assign]
        assert not other.cgroup.is_frozen()
        assert coord.state == states.IDLE and coord.status()["holder"] is None
        if g.gate is not None:
            assert g.gate.word is None, "gate left closed"
        # The lock is free: the next region is granted and ends normally.
        stuck.cgroup.thaw()
        grant = await asyncio.wait_for(coord.enter(other, g.pid(other), g.pid(other)), 10)
        await coord.exit(other, grant["epoch"], 0.0, 0)
        assert not stuck.cgroup.is_frozen() and not holder.cgroup.is_frozen()

    asyncio.run(scenario())
