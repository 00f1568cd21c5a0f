"""krex control-plane framing, shared by krexd and its clients.

One msgpack map per ZeroMQ frame (DEALER clients, krexd's ROUTER over
``ipc://<socket>``); the request, reply and error shapes:
docs/design/interfaces.md "Control plane"; the rules a request must meet:
:func:`decode_request`.  Speaks only of error names (their numbers are
``krex_client.errors``'), so it imports anywhere (no krexd, no GPU).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeGuard

import msgpack

PROTOCOL_VERSION = 1
"""Version carried in every frame as ``v``."""

MAX_FRAME_BYTES = 1 << 20
"""Largest request frame (bytes) krexd decodes; larger ones get a ``BAD_FRAME`` reply."""

MAX_REPLY_BYTES = 16 << 20
"""Largest reply frame (bytes) a client decodes: what krexd's socket lets through
(``ZMQ_MAXMSGSIZE``).  A ``status`` reply grows with the parked requests (up to
``[admission] max_parked``, each command line cut to 512 characters)."""

MAX_ID = (1 << 64) - 1

_REQUEST_KEYS = frozenset({"v", "id", "op", "tenant", "token", "body"})


class FrameError(Exception):
    """A frame that breaks the layout above.

    Attributes: ``name`` (error name, e.g. ``"BAD_FRAME"``), ``message`` (text
    naming the problem), ``request_id`` (the request's ``id`` when it could be
    read, else 0, so the error reply can still be matched).
    """

    def __init__(self, name: str, message: str, request_id: int = 0) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    """One decoded request: ``op`` name, ``id``, optional tenant credentials, ``body``."""

    op: str
    id: int
    body: dict[str, Any] = field(default_factory=dict)
    tenant: int | None = None
    token: str | None = None


@dataclass(frozen=True)
class RemoteErrorInfo:
    """The ``error`` map of an error reply."""

    code: int
    name: str
    message: str
    retry_s: float = 0.0  # > 0: the request was not run; asking again after this long fits


@dataclass(frozen=True)
class Reply:
    """One decoded reply: ``ok`` with ``body``, or not ``ok`` with ``error``."""

    id: int
    ok: bool
    body: dict[str, Any] = field(default_factory=dict)
    error: RemoteErrorInfo | None = None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _unpack_map(frame: bytes, limit: int = MAX_FRAME_BYTES) -> dict[str, Any]:
    if len(frame) > limit:
        raise FrameError("BAD_FRAME", f"frame of {len(frame)} bytes exceeds {limit}")
    try:
        obj = msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        # ExtraData, FormatError, StackError and UnicodeDecodeError are all ValueError.
        raise FrameError("BAD_FRAME", f"not a msgpack map: {type(exc).__name__}") from None
    if not isinstance(obj, dict):
        raise FrameError("BAD_FRAME", f"frame holds a {type(obj).__name__}, not a map")
    return obj


def encode_request(req: Request) -> bytes:
    """Serialize ``req`` to one frame (bytes)."""
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": req.id, "op": req.op, "body": req.body}
    if req.tenant is not None:
        msg["tenant"] = req.tenant
    if req.token is not None:
        msg["token"] = req.token
    return bytes(msgpack.packb(msg, use_bin_type=True))


def decode_request(frame: bytes) -> Request:
    """Parse one request frame; raises :class:`FrameError` naming the first broken rule.

    * the frame is at most :data:`MAX_FRAME_BYTES` bytes (``BAD_FRAME``; a
      reply: :data:`MAX_REPLY_BYTES`);
    * it is valid msgpack holding one map with ``str`` keys (``BAD_FRAME``);
    * ``v`` is present and equals :data:`PROTOCOL_VERSION` (``BAD_VERSION``);
    * ``id`` is an integer in [0, 2**64) (``BAD_FIELD``);
    * ``op`` is a non-empty ``str`` (``BAD_FIELD``); whether the op exists
      is the server's concern (``UNKNOWN_OP``);
    * ``tenant`` (when present) is an integer > 0, ``token`` a ``str``,
      ``body`` a map with ``str`` keys (``BAD_FIELD``); no other top-level
      keys (``BAD_FIELD``).
    """
    msg = _unpack_map(frame)
    raw_id = msg.get("id", 0)
    request_id = raw_id if _is_int(raw_id) and 0 <= raw_id <= MAX_ID else 0
    if "v" not in msg:
        raise FrameError("BAD_VERSION", "missing protocol version 'v'", request_id)
    if not _is_int(msg["v"]) or msg["v"] != PROTOCOL_VERSION:
        raise FrameError(
            "BAD_VERSION",
            f"protocol version {msg['v']!r} not supported (this side speaks {PROTOCOL_VERSION})",
            request_id,
        )
    extra = sorted(str(k) for k in msg if k not in _REQUEST_KEYS)
    if extra:
        raise FrameError("BAD_FIELD", f"unknown request keys: {', '.join(extra)}", request_id)
    if "id" not in msg or not _is_int(raw_id) or not 0 <= raw_id <= MAX_ID:
        raise FrameError("BAD_FIELD", "'id' must be an unsigned 64-bit integer", request_id)
    op = msg.get("op")
    if not isinstance(op, str) or not op:
        raise FrameError("BAD_FIELD", "'op' must be a non-empty string", request_id)
    tenant = msg.get("tenant")
    if tenant is not None and (not _is_int(tenant) or not 0 < tenant <= MAX_ID):
        raise FrameError("BAD_FIELD", "'tenant' must be an integer > 0", request_id)
    token = msg.get("token")
    if token is not None and not isinstance(token, str):
        raise FrameError("BAD_FIELD", "'token' must be a string", request_id)
    body = msg.get("body", {})
    if not isinstance(body, dict):
        raise FrameError("BAD_FIELD", "'body' must be a map", request_id)
    bad_key = next((k for k in body if not isinstance(k, str)), None)
    if bad_key is not None:
        raise FrameError(
            "BAD_FIELD", f"'body' keys must be strings, got {bad_key!r:.64}", request_id
        )
    return Request(op=op, id=raw_id, body=body, tenant=tenant, token=token)


def encode_ok(request_id: int, body: dict[str, Any]) -> bytes:
    """Serialize an ok reply to request ``request_id`` carrying ``body``."""
    msg = {"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "body": body}
    return bytes(msgpack.packb(msg, use_bin_type=True))


def encode_error(
    request_id: int, code: int, name: str, message: str, retry_s: float = 0.0
) -> bytes:
    """Serialize an error reply (``code``/``name`` from :mod:`krex_client.errors`);
    ``retry_s`` > 0 (seconds) tells the client that the request was not run and
    that asking again after that long fits (a connection over its uid's pace)."""
    error: dict[str, Any] = {"code": code, "name": name, "message": message}
    if retry_s > 0:
        error["retry_s"] = float(retry_s)
    msg = {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": error}
    return bytes(msgpack.packb(msg, use_bin_type=True))


def decode_reply(frame: bytes) -> Reply:
    """Parse one reply frame (at most :data:`MAX_REPLY_BYTES`); raises :class:`FrameError`
    when it breaks the layout."""
    msg = _unpack_map(frame, MAX_REPLY_BYTES)
    if msg.get("v") != PROTOCOL_VERSION:
        raise FrameError("BAD_VERSION", f"reply has protocol version {msg.get('v')!r}")
    rid = msg.get("id")
    if not _is_int(rid):
        raise FrameError("BAD_FIELD", "reply 'id' must be an integer")
    if msg.get("ok") is True:
        body = msg.get("body", {})
        if not isinstance(body, dict):
            raise FrameError("BAD_FIELD", "reply 'body' must be a map", rid)
        return Reply(id=rid, ok=True, body=body)
    err = msg.get("error")
    if msg.get("ok") is not False or not isinstance(err, dict):
        raise FrameError("BAD_FIELD", "reply needs ok=true with body or ok=false with error", rid)
    code, name, message = err.get("code"), err.get("name"), err.get("message")
    if not _is_int(code) or not isinstance(name, str) or not isinstance(message, str):
        raise FrameError("BAD_FIELD", "reply 'error' needs int code, str name, str message", rid)
    retry = err.get("retry_s", 0.0)
    if not isinstance(retry, (int, float)) or isinstance(retry, bool) or not 0 <= retry <= 3600:
        raise FrameError("BAD_FIELD", "reply 'error.retry_s' must be seconds in [0, 3600]", rid)
    return Reply(id=rid, ok=False, error=RemoteErrorInfo(code, name, message, float(retry)))
