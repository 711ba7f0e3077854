"""Protocol v1's envelope and the rules of one request's replies, shared by every client.

Three clients talk to the daemon: :mod:`modeld.client` (pyzmq), :mod:`modeld.http.bridge`
(pyzmq's asyncio flavour) and the CLI's fast path :mod:`modeld.cli.fastwire` (libzmq through
ctypes, for start-up time). Each keeps its own socket code; what a frame's object holds and what
a reply means (match the id; chunks, then one done or error; the error raised as its typed
exception) is decided here, once. Imports nothing at run time: the fast path pays for every
module it imports.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's import costs ~2 ms on the fast path; mypy reads typing's
if TYPE_CHECKING:
    from typing import Any

PROTOCOL_VERSION = 1
#: The keys every message has; the rest of its object is its body.
HEADER = ("v", "id", "type")
#: Reply types the daemon sends: zero or more ``chunk`` then exactly one ``done`` or ``error``.
REPLY_TYPES = frozenset({"chunk", "done", "error"})


def envelope(type_: str, request_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """The JSON object of one message: its body plus the header."""
    data = dict(body)
    data.update(v=PROTOCOL_VERSION, id=request_id, type=type_)
    return data


def body_of(data: dict[str, Any]) -> dict[str, Any]:
    """A message object without its header."""
    return {k: v for k, v in data.items() if k not in HEADER}


class ReplyStream:
    """The replies of one request, from every object that arrives on the client's socket.

    :meth:`feed` ignores replies to other requests (an abandoned one, a ping), returns
    ``(type, body)`` for a ``chunk`` or the ``done``, and raises the typed error of an
    ``error`` (:func:`modeld.errors.error_from_dict`). A reply to this request that this
    client cannot read (another protocol version, an unknown type, anything after the end) is a
    :class:`~modeld.errors.ProtocolMismatchError`: the daemon and client differ.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False  # the done or error arrived

    def feed(self, data: object) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(data, dict) or data.get("id") != self.request_id:
            return None
        kind = data.get("type")
        if data.get("v") != PROTOCOL_VERSION or kind not in REPLY_TYPES or self.finished:
            from modeld.errors import ProtocolMismatchError

            raise ProtocolMismatchError(
                "the daemon sent a reply this client cannot read "
                f"(protocol version {data.get('v')!r}, type {kind!r})",
                hint="the daemon and this client may be different versions: `modeld stop`, "
                "then `modeld serve` from this installation",
            )
        body = body_of(data)
        if kind != "chunk":
            self.finished = True
        if kind == "error":
            from modeld.errors import error_from_dict

            raise error_from_dict(body)
        return str(kind), body
