"""Typed Python client for the modeld daemon (used by the CLI and by Python callers).

One DEALER socket per :class:`Client`; a Client is not thread-safe (use one per thread). Every
method sends one request and reads its replies; ``generate``/``chat`` stream text chunks.
Error replies come back as the typed exceptions of :mod:`modeld.errors`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator, Sequence
from types import TracebackType
from typing import Any, cast

import zmq

from modeld import paths
from modeld.errors import (
    DaemonUnavailableError,
    ModeldError,
    RequestTimeoutError,
)
from modeld.socketcheck import socket_problem
from modeld.wire import protocol, requestfields
from modeld.wire.replies import EmbedDone, GenerateDone, PsReply, PsRow, RerankDone, UnloadedRow
from modeld.wire.replyflow import ReplyStream

_UNAVAILABLE_HINT = "start it with modeld serve"
#: Seconds of silence after which a waiting client checks that the daemon still answers.
HEARTBEAT_S = 5.0


class Generation:
    """Iterator of text chunks of one generate request; ``done`` holds the final info.

    Leaving the iteration early (``close()``, ``break`` in a ``with`` block, Ctrl-C) sends a
    ``cancel`` so the daemon frees the model promptly.
    """

    def __init__(self, client: Client, request_id: str) -> None:
        self._client = client
        self.request_id = request_id
        self.done: GenerateDone | None = None
        self._replies = ReplyStream(request_id)
        self._closed = False
        #: called with each piece of the model's thinking (kept apart from the text)
        self.on_thinking: Callable[[str], None] | None = None

    def __iter__(self) -> Iterator[str]:
        try:
            while not (self._closed or self._replies.finished):
                kind, body = self._client._recv(self._replies, self._client.timeout)
                if kind == "done":
                    self.done = cast(GenerateDone, body)  # the daemon's done_body
                    break
                thinking = body.get("thinking")
                if isinstance(thinking, str) and self.on_thinking is not None:
                    self.on_thinking(thinking)
                text = body.get("text")
                if isinstance(text, str):
                    yield text
        finally:
            if not self._replies.finished:
                self.close()

    def text(self) -> str:
        """Consume the whole stream and return the concatenated text."""
        return "".join(self)

    def close(self) -> None:
        """Cancel the request if it has not finished (idempotent)."""
        if not (self._closed or self._replies.finished):
            self._closed = True
            self._client._cancel_quietly(self.request_id)

    def __enter__(self) -> Generation:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Client:
    """Connects to the daemon at ``endpoint`` (default: :func:`modeld.paths.socket_endpoint`).

    ``timeout``: seconds to wait for each reply message (None waits forever; a cold load of a
    big model can take a while). ``connect_timeout``: how long the first ping may take before
    the daemon counts as not running.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        timeout: float | None = 300.0,
        connect_timeout: float = 2.0,
    ) -> None:
        self.endpoint = endpoint or paths.socket_endpoint()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._ctx: zmq.Context[Any] | None = None
        self._sock: zmq.Socket[Any] | None = None
        self._ids = itertools.count(1)
        self._prefix = f"{os.getpid():x}-{id(self):x}"
        self._checked = False

    # ------------------------------------------------------------------ lifecycle

    def _socket(self) -> zmq.Socket[Any]:
        if self._sock is None:
            sock_path = paths.ipc_path(self.endpoint)
            if sock_path is not None and (problem := socket_problem(str(sock_path))):
                raise problem
            self._ctx = zmq.Context()
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            try:
                sock.connect(self.endpoint)
            except zmq.ZMQError as exc:  # an endpoint ZeroMQ refuses (config checks the form)
                sock.close()
                raise DaemonUnavailableError(
                    f"cannot connect to {self.endpoint}: {exc.strerror}",
                    hint="check MODELD_SOCKET / the `socket` setting (`modeld config`)",
                    details={"reason": "os_error"},
                ) from None
            self._sock = sock
        return self._sock

    def _ensure_connected(self) -> None:
        """Ping once per Client so a missing daemon is reported quickly and clearly."""
        if self._checked:
            return
        replies = ReplyStream(self._send("ping"))
        try:
            self._recv(replies, self.connect_timeout)
        except RequestTimeoutError:
            self.close()
            raise DaemonUnavailableError(
                f"daemon not running (no answer at {self.endpoint})", hint=_UNAVAILABLE_HINT
            ) from None
        self._checked = True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._checked = False

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ wire

    def _send(self, type_: str, **body: Any) -> str:
        rid = f"{self._prefix}-{next(self._ids)}"
        self._socket().send_multipart(protocol.encode(protocol.request(type_, rid, **body)))
        return rid

    def _recv(self, replies: ReplyStream, timeout: float | None) -> tuple[str, dict[str, Any]]:
        """The next chunk or the done of ``replies``' request (an error reply raised); replies
        to other (abandoned) requests are skipped.

        During a long silence (a slow load, a long prompt) the daemon is pinged every
        :data:`HEARTBEAT_S`; a daemon that no longer answers pings is reported as gone
        instead of making the caller wait for the whole timeout.
        """
        sock = self._socket()
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        heard = start
        ping_id: str | None = None
        while True:
            now = time.monotonic()
            wait = 500 if deadline is None else max(0, int((deadline - now) * 1000))
            if sock.poll(min(wait, 500), zmq.POLLIN):
                data = protocol.reply_object(sock.recv_multipart())
                heard = time.monotonic()
                if isinstance(data, dict) and ping_id is not None and data.get("id") == ping_id:
                    ping_id = None
                elif (reply := replies.feed(data)) is not None:
                    return reply
                continue
            now = time.monotonic()
            sock_path = paths.ipc_path(self.endpoint)
            if sock_path is not None and not os.path.exists(sock_path):
                raise DaemonUnavailableError(
                    "daemon went away while waiting for a reply", hint=_UNAVAILABLE_HINT
                )
            if deadline is not None and now >= deadline:
                raise RequestTimeoutError(
                    f"no reply from the daemon within {timeout:g} s",
                    hint="check `modeld ps` and the daemon log, or raise the timeout",
                )
            if ping_id is None and now - heard > HEARTBEAT_S:
                ping_id = self._send("ping")
                heard = now
            elif ping_id is not None and now - heard > HEARTBEAT_S:
                raise DaemonUnavailableError(
                    f"the daemon stopped answering (no reply to a ping in {HEARTBEAT_S:g} s)",
                    hint="check the daemon log; restart it with modeld serve",
                )

    def _call(self, type_: str, timeout: float | None = None, **body: Any) -> dict[str, Any]:
        self._ensure_connected()
        replies = ReplyStream(self._send(type_, **body))
        try:
            kind, reply = self._recv(replies, self.timeout if timeout is None else timeout)
        except (KeyboardInterrupt, RequestTimeoutError):
            self._cancel_quietly(replies.request_id)
            raise
        if kind != "done":
            raise ModeldError(f"unexpected {kind!r} reply to {type_}")
        return reply

    def _cancel_quietly(self, request_id: str) -> None:
        if self._sock is None:
            return
        with contextlib.suppress(zmq.ZMQError):
            self._send("cancel", target=request_id)

    # ------------------------------------------------------------------ API

    def generate(
        self,
        model: str | None,
        prompt: str,
        *,
        raw: bool = False,
        keep_alive: str | int | float | None = None,
        n_ctx: int | None = None,
        format: str | dict[str, Any] | None = None,
        stream: bool = True,
        images: Sequence[bytes] = (),
        **options: Any,
    ) -> Generation:
        """Stream a completion; options: those of :class:`modeld.wire.options.Sampling` and the
        request's fields of :class:`modeld.wire.requestfields.Asked` (``count_only=True``, ...);
        ``format``: "json" or a JSON Schema the reply must follow; ``stream`` false: the reply
        is read whole, so its text comes in a few large chunks (fewer wake-ups while decoding);
        ``images``: image files shown to the model before the prompt (PNG, JPEG, WebP, GIF)."""
        what = {"prompt": prompt, "format": format, "stream": None if stream else False,
                "images": list(images) or None}  # binary frames
        return self._stream(model, what, raw, keep_alive, n_ctx, options)

    def chat(
        self,
        model: str | None,
        messages: list[dict[str, str]],
        *,
        keep_alive: str | int | float | None = None,
        n_ctx: int | None = None,
        format: str | dict[str, Any] | None = None,
        think: bool | None = None,
        stream: bool = True,
        **options: Any,
    ) -> Generation:
        """Stream a chat reply using the model's chat template (``format`` and ``stream`` as for
        :meth:`generate`; ``think``: the model's thinking on or off, None its default)."""
        what = {"messages": messages, "format": format, "think": think,
                "stream": None if stream else False}
        return self._stream(model, what, False, keep_alive, n_ctx, options)

    def _stream(
        self,
        model: str | None,
        what: dict[str, Any],
        raw: bool,
        keep_alive: str | int | float | None,
        n_ctx: int | None,
        options: dict[str, Any],
    ) -> Generation:
        self._ensure_connected()
        asked = {k: v for k, v in options.items() if k in requestfields.ASKED_NAMES}
        what = {**what, **asked}  # the request's own fields, at its top level
        opts = {k: v for k, v in options.items() if v is not None and k not in asked}
        if raw:
            opts["raw"] = True
        if keep_alive is not None:
            opts["keep_alive"] = keep_alive
        if n_ctx is not None:
            opts["n_ctx"] = n_ctx
        rid = self._send("generate", model=model, options=opts,
                         **{k: v for k, v in what.items() if v is not None})
        return Generation(self, rid)

    def embed(
        self,
        model: str | None,
        inputs: str | list[str],
        *,
        keep_alive: str | int | float | None = None,
        n_ctx: int | None = None,
    ) -> EmbedDone:
        """Embeddings: the reply has ``embeddings`` (one list of floats per input)."""
        reply = self._call("embed", model=model, inputs=inputs, keep_alive=keep_alive, n_ctx=n_ctx)
        return cast(EmbedDone, reply)

    def rerank(
        self,
        model: str | None,
        query: str,
        documents: list[str],
        *,
        top_n: int | None = None,
        keep_alive: str | int | float | None = None,
        n_ctx: int | None = None,
    ) -> RerankDone:
        """Relevance of each document to ``query``: the reply has ``results`` of ``index`` and
        ``relevance_score``, in input order, or the ``top_n`` best, best first."""
        reply = self._call("rerank", model=model, query=query, documents=documents,
                           top_n=top_n, keep_alive=keep_alive, n_ctx=n_ctx)  # fmt: skip
        return cast(RerankDone, reply)

    def load(
        self,
        model: str | None,
        *,
        mode: str | None = None,
        n_ctx: int | None = None,
        keep_alive: str | int | float | None = None,
        pinned: bool = False,
        parallel: int | None = None,
        kv_unified: bool | None = None,
        rpc: Sequence[str] | None = None,
        kv_cache_type: str | None = None,
        gpu_layers: int | None = None,
        mmproj: str | None = None,
    ) -> PsRow | UnloadedRow:
        """Load (or touch) a model; returns its entry as one ``ps`` row. ``mode`` None: what
        the model is made for (rerank for a reranker, else generate). ``parallel``: the
        requests it decodes together (None: the daemon's setting, else automatic);
        ``kv_unified``: they share one pool of ``n_ctx`` cells (None: the config's). ``rpc``:
        llama.cpp RPC workers ("HOST:PORT") that get every layer (None: the config's).
        ``kv_cache_type`` (f16, q8_0, q4_0) and ``gpu_layers`` (-1: auto, 0: CPU only): None
        is the config's (per model, else the setting). ``mmproj``: the image projector to load
        with ("": none; None: the config's, else the one beside the model)."""
        extra: dict[str, Any] = {k: v for k, v in (("kv_cache_type", kv_cache_type),
                                                   ("gpu_layers", gpu_layers),
                                                   ("kv_unified", kv_unified),
                                                   ("mmproj", mmproj)) if v is not None}
        reply = self._call(
            "load", model=model, mode=mode, n_ctx=n_ctx, keep_alive=keep_alive, pinned=pinned,
            parallel=parallel, rpc=None if rpc is None else list(rpc), **extra,
        )
        row = reply.get("model")
        return cast(PsRow | UnloadedRow, row if isinstance(row, dict) else reply)

    def unload(
        self, model: str | None = None, *, all: bool = False, mode: str | None = None
    ) -> dict[str, Any]:
        """Unload a model (or all); busy ones go when their requests finish."""
        return self._call("unload", model=model, all=all, mode=mode)

    def ps(self) -> list[PsRow]:
        models = self.ps_reply().get("models", [])
        return list(models) if isinstance(models, list) else []

    def ps_reply(self) -> PsReply:
        """The whole ``ps`` reply: the rows and the budget, bytes used and model slots."""
        return cast(PsReply, self._call("ps"))

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def show(
        self, model: str | None, *, mode: str | None = None, n_ctx: int | None = None
    ) -> dict[str, Any]:
        """Metadata, estimated memory, the n_ctx it would get and what would be evicted
        (``mode`` None: what the model is made for)."""
        return self._call("show", model=model, mode=mode, n_ctx=n_ctx)

    def ping(self) -> dict[str, Any]:
        return self._call("ping")

    def version(self) -> dict[str, Any]:
        return self._call("version")

    def shutdown(self) -> dict[str, Any]:
        return self._call("shutdown")

    def cancel(self, request_id: str) -> None:
        """Ask the daemon to cancel one of this client's requests (no reply is awaited)."""
        self._send("cancel", target=request_id)
