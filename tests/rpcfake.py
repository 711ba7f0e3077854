"""A loopback listener that answers like a llama.cpp RPC worker of a given release, byte for
byte as ggml-rpc.cpp's ``rpc_serve_client`` does for ``HELLO`` (and, for the current layout,
``DEVICE_COUNT``/``GET_DEVICE_MEMORY``): to test version mismatches and memory probes without
a second llama.cpp build. ``legacy``: a release before the connection capabilities (protocol
3.x): its HELLO request is empty and its reply 3 bytes; any other request size hangs up."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

CAPS = 24


def _recv(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            raise ConnectionResetError
        data += part
    return data


class FakeWorker:
    def __init__(self, version: tuple[int, int, int], *, legacy: bool = False,
                 memory: tuple[int, int] = (8 << 30, 16 << 30)) -> None:  # fmt: skip
        self.version, self.legacy, self.memory = version, legacy, memory
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.hellos = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError, struct.error):
                self._client(conn)

    def _client(self, conn: socket.socket) -> None:
        if _recv(conn, 1)[0] != 14:  # "Expected HELLO command, update client"
            return
        size = struct.unpack("<Q", _recv(conn, 8))[0]
        self.hellos += 1
        if self.legacy:
            if size != 0:  # recv_msg(sock, nullptr, 0): a size mismatch drops the client
                return
            conn.sendall(struct.pack("<Q", 3) + bytes(self.version))
        else:
            if size != CAPS:  # "HELLO request size mismatch": dropped
                return
            _recv(conn, CAPS)
            conn.sendall(struct.pack("<Q", 4 + CAPS) + bytes((*self.version, 0)) + bytes(CAPS))
        while True:
            cmd = _recv(conn, 1)[0]
            size = struct.unpack("<Q", _recv(conn, 8))[0]
            payload = _recv(conn, size)
            if cmd == 15:  # DEVICE_COUNT
                conn.sendall(struct.pack("<QI", 4, 1))
            elif cmd == 11 and struct.unpack("<I", payload)[0] == 0:  # GET_DEVICE_MEMORY
                conn.sendall(struct.pack("<QQQ", 16, *self.memory))
            else:
                return

    def close(self) -> None:
        self.sock.close()
