"""Region requests run once across restarts: duplicates driven on the wire.

After a restart a region request may reach the new krexd twice (the
client's re-send and the lost connection's queued copy).  Here the test
itself is the client: root, with the tenant's id and token, speaks for a
``sleep`` that is the tenant's process, and sends the same request twice.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from krex_client.connection import Connection, KrexUnavailable, RemoteError
from tests.restarts.conftest import Restarter
from tests.restarts.test_kill_steps import frozen_tenants
from tests.support import wait_for
from tests.support.krexd import Krexd

pytestmark = [pytest.mark.root]
Factory = Callable[..., Krexd]


class Tenant:
    """A ``krex run -- sleep`` whose id, token and pid the test reads from a file."""

    def __init__(self, k: Krexd, name: str) -> None:
        info = os.path.join(k.workdir, f"{name}.info")
        script = f'echo "$KREX_TENANT $KREX_TOKEN $$" > {info}.tmp; mv {info}.tmp {info}; '
        self.proc = subprocess.Popen(
            [*k.krex, "run", "--", "sh", "-c", script + "exec sleep 120"],
            env=k.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_for(lambda: os.path.exists(info), what=f"{name} started")
        with open(info) as f:
            tenant, self.token, pid = f.read().split()
        self.id, self.pid = int(tenant), int(pid)

    def request(self, k: Krexd, op: str, body: dict[str, Any], timeout_s: float = 10.0) -> Any:
        """One request for this tenant on a fresh connection."""
        with Connection(k.socket, self.id, self.token, timeout_s=timeout_s) as conn:
            return conn.request(op, body)

    def enter_body(self, request_id: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"pid": self.pid, "tid": self.pid}
        if request_id is not None:
            body["request_id"] = request_id
        return body


@pytest.fixture
def two(krexd_factory: Factory) -> Iterator[tuple[Krexd, Tenant, Tenant]]:
    k = krexd_factory(slots=4, env={"KREX_TEST_PAUSE_AT": "closed", "KREX_TEST_PAUSE_S": "30"})
    holder, sibling = Tenant(k, "holder"), Tenant(k, "sibling")
    yield k, holder, sibling
    for t in (holder, sibling):
        t.proc.kill()
        t.proc.wait()


def both(fn: Callable[[], Any]) -> list[Any]:
    """Run ``fn`` twice at once; each result or the exception it raised."""
    out: list[Any] = [None, None]

    def run(i: int) -> None:
        try:
            out[i] = fn()
        except Exception as exc:  # noqa: BLE001 - the test compares outcomes
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_duplicated_exit_after_a_restart_is_answered_twice(
    two: tuple[Krexd, Tenant, Tenant], restarter: Restarter
) -> None:
    k, holder, _ = two
    # The first entry pauses at "closed": killed there, the restarted krexd (no pause)
    # thaws everything, and the entry is sent again.
    try:
        holder.request(k, "region_enter", holder.enter_body(), timeout_s=2.0)
    except KrexUnavailable:
        pass
    restarter.kill(k)
    k1 = restarter.start_again(k)
    grant = holder.request(k1, "region_enter", holder.enter_body())
    assert frozen_tenants(k1)
    restarter.kill(k1)  # killed holding the region: the next krexd adopts it
    k2 = restarter.start_again(k1)
    assert k2.status()["gpus"][0]["region"]["holder"]["epoch"] == grant["epoch"]
    body = {"epoch": grant["epoch"], "sync_ms": 0.0, "launches": 1}  # an older client's
    first, second = (holder.request(k2, "region_exit", body) for _ in range(2))
    assert first["launches"] == second["launches"] == 1
    assert k2.status()["gpus"][0]["region"]["holder"] is None
    assert not frozen_tenants(k2)
    k2.stop()


def test_a_duplicated_enter_after_a_restart_is_one_region(
    two: tuple[Krexd, Tenant, Tenant], restarter: Restarter
) -> None:
    k, holder, _ = two
    body = holder.enter_body(request_id=f"{holder.pid}-1-1")
    lost = threading.Thread(target=both, args=(lambda: holder.request(k, "region_enter", body),))
    lost.start()
    wait_for(lambda: "test pause at closed" in k.log(), what="the entry paused")
    restarter.kill(k)  # the entry was in flight
    lost.join(30)
    k2 = restarter.start_again(k)
    # The re-sent copy and the lost connection's copy reach the new krexd together.
    grants = both(lambda: holder.request(k2, "region_enter", body))
    assert all(isinstance(g, dict) for g in grants), grants
    assert grants[0]["epoch"] == grants[1]["epoch"]
    epoch = grants[0]["epoch"]
    assert len(frozen_tenants(k2)) == 1  # the sibling
    exit_body = {"epoch": epoch, "sync_ms": 0.0, "launches": 0, "request_id": f"{holder.pid}-1-2"}
    exits = both(lambda: holder.request(k2, "region_exit", exit_body))
    assert all(isinstance(e, dict) for e in exits), exits
    # A copy arriving late is answered as the first was, and starts no region.
    assert holder.request(k2, "region_enter", body)["epoch"] == epoch
    time.sleep(0.2)
    assert k2.status()["gpus"][0]["region"]["holder"] is None
    assert not frozen_tenants(k2)
    # The holder's next region is granted (no NESTED_REGION from a phantom one).
    nxt = holder.request(k2, "region_enter", holder.enter_body(f"{holder.pid}-1-3"))
    assert nxt["epoch"] > epoch
    holder.request(k2, "region_exit", {"epoch": nxt["epoch"]})
    with pytest.raises(RemoteError):  # an unknown epoch is still refused
        holder.request(k2, "region_exit", {"epoch": nxt["epoch"] + 5})
    k2.stop()
