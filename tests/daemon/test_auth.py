"""Tenant credentials: every request after admit needs the tenant's id and its token."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import pytest

from krex_client.connection import Connection, RemoteError
from tests.support.krexd import Krexd

pytestmark = pytest.mark.root
Factory = Callable[..., Krexd]


def admit(k: Krexd) -> dict[str, object]:
    with Connection(k.socket) as c:
        return c.request("admit", {"argv": ["x"], "launcher_pid": os.getpid()})


def refused(
    k: Krexd, op: str, body: dict[str, object], tenant: int | None, token: str | None
) -> str:
    with pytest.raises(RemoteError) as info:
        k.request(op, body, tenant=tenant, token=token)
    return info.value.name


def test_tokens_are_checked(krexd_factory: Factory) -> None:
    k = krexd_factory(slots=2)
    a, b = admit(k), admit(k)
    ta, tb = int(a["tenant"]), int(b["tenant"])  # type: ignore[call-overload]
    assert ta != tb and a["token"] != b["token"]
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert refused(k, "place", {"pid": child.pid}, ta, "0" * 32) == "AUTH"
        # Another tenant's id with one's own token is refused.
        assert refused(k, "place", {"pid": child.pid}, tb, str(a["token"])) == "AUTH"
        assert refused(k, "release", {}, None, None) == "AUTH"
        assert refused(k, "release", {}, 999, str(a["token"])) == "AUTH"
        # The pid must be a child of the tenant's launcher (here: this test process).
        assert refused(k, "place", {"pid": 1}, ta, str(a["token"])) == "AUTH"
        assert refused(k, "place", {"pid": os.getpid()}, ta, str(a["token"])) == "AUTH"
        placed = k.request("place", {"pid": child.pid}, tenant=ta, token=str(a["token"]))
        cgroups = placed["cgroups"]
        assert isinstance(cgroups, list)
        with open(os.path.join(cgroups[0], "cgroup.procs")) as f:
            assert str(child.pid) in f.read().split()
        assert k.request("release", {"exit_code": 0}, tenant=ta, token=str(a["token"])) == {
            "kill_reason": None,
            "exit_code": None,
        }
        # Releasing killed what was left in the tenant's cgroup.
        assert child.wait(10) == -9
        # A released tenant's token is dead.
        assert refused(k, "release", {}, ta, str(a["token"])) == "AUTH"
        assert k.request("release", {}, tenant=tb, token=str(b["token"]))["kill_reason"] is None
    finally:
        child.kill()
        child.wait()


def test_slot_memory_is_attached_by_the_first_place_only(krexd_factory: Factory) -> None:
    """A running tenant that placed without slot memory cannot attach one later.

    A region entry takes a running tenant with nothing attached for one with no
    registration to drain (it may freeze it and stop waiting for it): memory
    attached after that would hold registrations no drain ever waited for.
    """
    from krex_cli import slotmem

    k = krexd_factory(slots=2)
    a = admit(k)
    slots = a.get("slots")
    assert isinstance(slots, dict), "a shared tenant on a gated GPU gets slot memory"
    tenant, token = int(a["tenant"]), str(a["token"])  # type: ignore[call-overload]
    fd = slotmem.create(int(slots["size"]), bytes(slots["header"]))
    first = subprocess.Popen(["sleep", "30"])
    second = subprocess.Popen(["sleep", "30"])
    try:
        k.request("place", {"pid": first.pid}, tenant=tenant, token=token)  # now running
        body = {"pid": second.pid, "slots_fd": fd}
        assert refused(k, "place", body, tenant, token) == "BAD_FIELD"
        k.request("release", {"exit_code": 0}, tenant=tenant, token=token)
    finally:
        os.close(fd)
        for p in (first, second):
            p.kill()
            p.wait()
