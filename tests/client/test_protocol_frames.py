"""krex_client.protocol: one test per malformed-frame case, and round trips."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from krex_client.protocol import (
    MAX_FRAME_BYTES,
    FrameError,
    Request,
    decode_reply,
    decode_request,
    encode_error,
    encode_ok,
    encode_request,
)


def pack(obj: Any) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


def err(frame: bytes) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_request(frame)
    return info.value


def test_round_trip() -> None:
    req = Request(op="place", id=7, body={"pid": 12}, tenant=3, token="ab")
    assert decode_request(encode_request(req)) == req


def test_round_trip_without_credentials() -> None:
    got = decode_request(encode_request(Request(op="ping", id=0)))
    assert (got.op, got.id, got.tenant, got.token, got.body) == ("ping", 0, None, None, {})


def test_not_msgpack() -> None:
    e = err(b"\xc1\xc1\xc1")
    assert e.name == "BAD_FRAME" and "msgpack" in e.message


def test_trailing_garbage() -> None:
    assert err(pack({"v": 1, "id": 1, "op": "ping"}) + b"\x00").name == "BAD_FRAME"


def test_empty_frame() -> None:
    assert err(b"").name == "BAD_FRAME"


def test_not_a_map() -> None:
    e = err(pack([1, 2, 3]))
    assert e.name == "BAD_FRAME" and "list" in e.message


def test_non_string_keys() -> None:
    assert err(pack({1: 2})).name == "BAD_FRAME"


def test_oversized() -> None:
    e = err(b"\x00" * (MAX_FRAME_BYTES + 1))
    assert e.name == "BAD_FRAME" and str(MAX_FRAME_BYTES) in e.message


def test_missing_version() -> None:
    e = err(pack({"id": 5, "op": "ping"}))
    assert (e.name, e.request_id) == ("BAD_VERSION", 5)


def test_wrong_version() -> None:
    e = err(pack({"v": 2, "id": 5, "op": "ping"}))
    assert e.name == "BAD_VERSION" and "2" in e.message


def test_version_of_wrong_type() -> None:
    assert err(pack({"v": "1", "id": 1, "op": "ping"})).name == "BAD_VERSION"


def test_bool_is_not_a_version() -> None:
    assert err(pack({"v": True, "id": 1, "op": "ping"})).name == "BAD_VERSION"


@pytest.mark.parametrize("bad_id", [-1, -(1 << 40), "3", 1.5, None, True])
def test_bad_id(bad_id: Any) -> None:
    e = err(pack({"v": 1, "id": bad_id, "op": "ping"}))
    assert e.name == "BAD_FIELD" and "id" in e.message and e.request_id == 0


def test_missing_id() -> None:
    assert err(pack({"v": 1, "op": "ping"})).name == "BAD_FIELD"


@pytest.mark.parametrize("op", ["", 3, None, b"ping"])
def test_bad_op(op: Any) -> None:
    e = err(pack({"v": 1, "id": 9, "op": op}))
    assert (e.name, e.request_id) == ("BAD_FIELD", 9) and "op" in e.message


@pytest.mark.parametrize("tenant", [0, -3, "1", 1.0])
def test_bad_tenant(tenant: Any) -> None:
    e = err(pack({"v": 1, "id": 1, "op": "place", "tenant": tenant, "token": "x"}))
    assert e.name == "BAD_FIELD" and "tenant" in e.message


def test_bad_token() -> None:
    e = err(pack({"v": 1, "id": 1, "op": "place", "tenant": 1, "token": b"x"}))
    assert e.name == "BAD_FIELD" and "token" in e.message


@pytest.mark.parametrize("body", [[], "x", 1, None])
def test_bad_body(body: Any) -> None:
    e = err(pack({"v": 1, "id": 1, "op": "ping", "body": body}))
    assert e.name == "BAD_FIELD" and "body" in e.message


def test_unknown_top_level_key() -> None:
    e = err(pack({"v": 1, "id": 1, "op": "ping", "colour": "red"}))
    assert e.name == "BAD_FIELD" and "colour" in e.message


def test_reply_round_trips() -> None:
    ok = decode_reply(encode_ok(4, {"a": 1}))
    assert (ok.id, ok.ok, ok.body) == (4, True, {"a": 1})
    bad = decode_reply(encode_error(5, 3, "UNKNOWN_OP", "nope"))
    assert bad.error is not None and (bad.id, bad.ok, bad.error.name) == (5, False, "UNKNOWN_OP")


def test_an_error_says_when_to_ask_again_only_when_it_may() -> None:
    assert decode_reply(encode_error(5, 17, "TOO_MANY", "cap")).error.retry_s == 0.0  # type: ignore[union-attr]
    again = decode_reply(encode_error(6, 17, "TOO_MANY", "pace", retry_s=0.25)).error
    assert again is not None and again.retry_s == 0.25
    for bad in (-1.0, 1e9, "soon", True):
        frame = pack(
            {
                "v": 1,
                "id": 1,
                "ok": False,
                "error": {"code": 17, "name": "TOO_MANY", "message": "m", "retry_s": bad},
            }
        )
        with pytest.raises(FrameError, match="retry_s"):
            decode_reply(frame)


def test_reply_without_ok_is_refused() -> None:
    with pytest.raises(FrameError):
        decode_reply(pack({"v": 1, "id": 1}))


@pytest.mark.parametrize("body", [{"a": 1, b"b": 2}, {b"argv": ["x"]}])
def test_body_keys_must_be_strings(body: Any) -> None:
    e = err(pack({"v": 1, "id": 7, "op": "admit", "body": body}))
    assert e.name == "BAD_FIELD" and "keys must be strings" in e.message and e.request_id == 7
