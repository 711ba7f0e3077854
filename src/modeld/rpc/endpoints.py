"""llama.cpp RPC workers: endpoint syntax, the loopback rule and a handshake probe (stdlib only).

A worker (``modeld rpc-worker``, or upstream's ``ggml-rpc-server``) exposes its memory over TCP;
a runner loaded with ``rpc`` endpoints places layers and KV cache on them (docs/rpc.md). llama.cpp
aborts its process when an endpoint cannot be reached, and blocks forever when a worker is busy
with another client (a worker serves one connection at a time), so a runner probes each endpoint
with :func:`probe` before it registers any: the first message of llama.cpp's protocol (``HELLO``,
command 14) is sent and the worker's version read back, within a timeout.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from modeld.errors import InvalidRequestError, ModeldError, RpcWorkerError

#: llama.cpp's RPC protocol version this build speaks (``ggml-rpc.h`` of llama-cpp-python
#: 0.3.36): a worker must answer the same major and no newer minor.
PROTO_MAJOR = 7
PROTO_MINOR = 0
_CMD_GET_DEVICE_MEMORY = 11
_CMD_HELLO = 14
_CMD_DEVICE_COUNT = 15
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE (transport.h)
#: Most workers one model may use.
MAX_ENDPOINTS = 16
#: Seconds a probe waits to connect, and then for the worker's answer.
PROBE_TIMEOUT_S = 3.0
#: upstream's warning (tools/rpc/README.md, SECURITY.md), printed by a worker beyond loopback.
INSECURE_WARNING = (
    "WARNING: the llama.cpp RPC server has no authentication and no encryption, and runs any "
    "graph and buffer write it is sent: never run it on an open network or in a sensitive "
    "environment. Reach it through an SSH or WireGuard tunnel to a worker bound to 127.0.0.1."
)


def worker_error(endpoint: str, message: str, hint: str, problem: str) -> RpcWorkerError:
    """The typed error about one worker (``details``: its endpoint and the problem)."""
    return RpcWorkerError(message, hint=hint, details={"endpoint": endpoint, "problem": problem})


@dataclass(frozen=True)
class DeviceMemory:
    """One device of a worker as llama.cpp's ``GET_DEVICE_MEMORY`` reports it (a CPU worker
    reports its whole physical RAM as free: llama.cpp does not measure free RAM)."""

    index: int
    free: int
    total: int


@dataclass(frozen=True)
class Hello:
    """What a worker said to ``HELLO``, and its devices' memory (asked on the same connection
    when the version matches)."""

    major: int
    minor: int
    patch: int
    devices: tuple[DeviceMemory, ...] = ()

    @property
    def free(self) -> int:
        """Free bytes over the worker's devices."""
        return sum(d.free for d in self.devices)

    @property
    def version(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def parse_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv4 or a name; llama.cpp splits at the first colon) → (host, port)."""
    host, sep, port_text = text.strip().partition(":")
    if not sep or not host or ":" in port_text or not port_text.isdigit():
        raise InvalidRequestError(
            f"rpc endpoint {text!r} is not HOST:PORT",
            hint="give workers as HOST:PORT, e.g. 127.0.0.1:50052 (IPv6 is not supported by "
            "llama.cpp's RPC client)",
        )
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise InvalidRequestError(f"rpc endpoint {text!r}: port must be 1-65535")
    return host, port


def parse_endpoints(value: str | Iterable[str]) -> tuple[str, ...]:
    """A comma-separated string or a list of ``HOST:PORT`` → normalised, distinct endpoints."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidRequestError("'rpc' must be a list of \"HOST:PORT\" strings")
        if not item.strip():
            continue
        host, port = parse_endpoint(item)
        ep = f"{host}:{port}"
        if ep in out:
            raise InvalidRequestError(f"rpc endpoint {ep} is given twice")
        out.append(ep)
    if not out:
        raise InvalidRequestError("'rpc' names no worker", hint="give HOST:PORT[,HOST:PORT...]")
    if len(out) > MAX_ENDPOINTS:
        raise InvalidRequestError(f"at most {MAX_ENDPOINTS} rpc workers per model")
    return tuple(out)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_address(host: str) -> str:
    """The IPv4 address a worker started with ``--host HOST`` listens on. llama.cpp's RPC
    server (ggml-rpc of llama-cpp-python 0.3.36) splits ``HOST:PORT`` at its first colon and
    takes only an IPv4 address (``inet_addr``; its client resolves names with
    ``gethostbyname``): a name is resolved here (``localhost`` → ``127.0.0.1``), an IPv6
    address (``::1``, ``[::1]``) is refused with that reason."""
    bare = host.strip()
    if bare.startswith("[") and bare.endswith("]"):
        bare = bare[1:-1]
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    if ip is not None and ip.version == 6:
        raise InvalidRequestError(
            f"cannot listen on {host}: llama.cpp's RPC server and client speak IPv4 only "
            "(they split HOST:PORT at the first colon)",
            hint="use --host 127.0.0.1, the IPv4 loopback" + (
                "" if ip.is_loopback else ", or this machine's IPv4 address"),
        )  # fmt: skip
    if ip is not None:
        return str(ip)
    try:
        found = socket.getaddrinfo(bare, None, socket.AF_INET, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise InvalidRequestError(f"cannot listen on {host}: no IPv4 address for that name "
                                  f"({getattr(exc, 'strerror', None) or exc})",
                                  hint="give an IPv4 address, e.g. --host 127.0.0.1") from None
    return str(found[0][4][0])


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionResetError("closed by the worker")
        data += part
    return data


def _send(sock: socket.socket, cmd: int, payload: bytes) -> int:
    """One command of llama.cpp's RPC protocol: ``| cmd u8 | size u64 | payload |`` out; the
    reply's size (``| size u64 | reply |`` back: ggml-rpc.cpp ``send_rpc_cmd``)."""
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    return int(struct.unpack("<Q", _recv_exact(sock, 8))[0])


def _ask(sock: socket.socket, cmd: int, payload: bytes, size: int) -> bytes:
    """:func:`_send`, then its reply, which must be ``size`` bytes."""
    got = _send(sock, cmd, payload)
    if got != size:
        raise ConnectionResetError(f"a reply of {got} bytes to command {cmd}, not {size}")
    return _recv_exact(sock, size)


def _memory(sock: socket.socket) -> tuple[DeviceMemory, ...]:
    """``DEVICE_COUNT`` then ``GET_DEVICE_MEMORY`` (``device`` u32 → ``free``, ``total`` u64)
    for each device, as llama.cpp's client asks when it registers a worker."""
    (count,) = struct.unpack("<I", _ask(sock, _CMD_DEVICE_COUNT, b"", 4))
    out = []
    for i in range(min(int(count), 64)):
        free, total = struct.unpack("<QQ", _ask(sock, _CMD_GET_DEVICE_MEMORY,
                                                 struct.pack("<I", i), 16))  # fmt: skip
        out.append(DeviceMemory(i, int(free), int(total)))
    return tuple(out)


def probe(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> Hello:
    """Connect to ``endpoint``, say ``HELLO``, read its version and then its devices' memory;
    raise RpcWorkerError naming the endpoint when it is unreachable, busy (no answer in
    ``timeout_s``: serving another client) or speaks another protocol version. The connection
    is closed again, so the worker goes back to waiting for its next client."""
    host, port = parse_endpoint(endpoint)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as exc:
        raise _unreachable(endpoint, exc) from exc
    try:
        sock.settimeout(timeout_s)
        size = _send(sock, _CMD_HELLO, bytes(_CONN_CAPS))
        if not 3 <= size <= 4096:
            raise _mismatch(endpoint, f"a HELLO reply of {size} bytes")
        major, minor, patch = _recv_exact(sock, size)[:3]
        if major != PROTO_MAJOR or minor > PROTO_MINOR:
            theirs = f"{major}.{minor}.{patch}"
            raise _mismatch(endpoint, f"protocol {theirs}", theirs)
        if size != 4 + _CONN_CAPS:
            raise _mismatch(endpoint, f"a HELLO reply of {size} bytes")
        devices = _memory(sock)
    except TimeoutError as exc:
        raise worker_error(
            endpoint, f"rpc worker {endpoint} did not answer within {timeout_s:g} s: it is busy "
            "with another client (a worker serves one at a time) or stuck",
            "free it (unload the model using it, or stop the other client), or start another "
            "worker", "busy",
        ) from exc  # fmt: skip
    except OSError as exc:  # closed on us: a worker of another protocol version drops HELLO
        sock.close()
        old = _legacy_version(host, port, timeout_s)
        if old is not None:
            raise _mismatch(endpoint, f"protocol {old}", old) from exc
        raise _mismatch(endpoint, f"the connection was closed ({exc})") from exc
    finally:
        sock.close()
    return Hello(major, minor, patch, devices)


def _legacy_version(host: str, port: int, timeout_s: float) -> str | None:
    """The version of a worker that closed on this build's ``HELLO``, asked the way releases
    before the connection capabilities did (an empty request, a 3-byte reply: protocol 3.x of
    ggml-rpc.cpp); None when it does not answer that either."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            if _send(sock, _CMD_HELLO, b"") != 3:
                return None
            major, minor, patch = _recv_exact(sock, 3)
            return f"{major}.{minor}.{patch}"
    except OSError:
        return None


def _mismatch(endpoint: str, what: str, worker_version: str | None = None) -> RpcWorkerError:
    err = worker_error(
        endpoint, f"rpc worker {endpoint} speaks another RPC protocol version ({what}; this "
        f"build speaks {PROTO_MAJOR}.{PROTO_MINOR}.x)",
        "run the same llama-cpp-python version on both sides (modeld's setup.sh pins it)",
        "version",
    )  # fmt: skip
    err.details["client_version"] = f"{PROTO_MAJOR}.{PROTO_MINOR}.0"
    if worker_version is not None:
        err.details["worker_version"] = worker_version
    return err


def _unreachable(endpoint: str, exc: OSError) -> RpcWorkerError:
    return worker_error(
        endpoint, f"rpc worker {endpoint} is unreachable: {exc.strerror or exc}",
        "start it there with 'modeld rpc-worker --port PORT' (or check the address and any "
        "tunnel to it)", "unreachable",
    )  # fmt: skip


def require_reachable(endpoints: Iterable[str], timeout_s: float = 0.5) -> None:
    """A TCP connection to each endpoint opens, or the error :func:`probe` gives for it (no
    HELLO: a worker busy with its one client still accepts into its backlog)."""
    for endpoint in endpoints:
        host, port = parse_endpoint(endpoint)
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
        except OSError as exc:
            raise _unreachable(endpoint, exc) from exc


def reachable(endpoint: str, timeout_s: float = 0.5) -> bool:
    """Whether a TCP connection to ``endpoint`` opens (used after a runner died, to say which
    worker was lost; a busy or live worker accepts into its backlog)."""
    try:
        host, port = parse_endpoint(endpoint)
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except (OSError, ModeldError):
        return False


def lost_workers(endpoints: Iterable[str]) -> list[str]:
    """The endpoints that refuse (or time out) a TCP connection now."""
    return [ep for ep in endpoints if not reachable(ep)]
