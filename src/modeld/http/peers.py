"""Which local user is at the other end of a loopback TCP connection (Linux).

The unix socket is private by its 0700 directory (SO_PEERCRED is not even needed); a loopback
TCP port is reachable by every local user. Linux knows the owner of the connecting socket: the
kernel's socket table lists it by its address pair, with its ``uid``. One lookup per connection
(never per request): an exact ``SOCK_DIAG_BY_FAMILY`` query over netlink (what ``ss`` uses; one
socket found by its 4-tuple, ~30 µs however many connections exist), else the row of
``/proc/net/tcp`` or ``tcp6`` whose local and remote address:port are the client's (a search
of the table's text, not a parse of every row). None when neither answers (not Linux, or the
client already left).
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import struct
from typing import Any

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLMSG_ERROR = 2
_NO_COOKIE = 0xFFFFFFFF
_ALL_STATES = 0xFFFFFFFF
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_UID_AT = _HEADER.size + 4 + 48 + 12  # inet_diag_msg: 4 bytes, its sockid, 3 u32s, then uid

Address = tuple[Any, ...]  # (host, port[, flowinfo, scope_id]) as asyncio gives it


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``host`` as an address; an IPv4-mapped IPv6 one (a dual-stack listener) as IPv4."""
    ip = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def is_loopback_peer(peer: Address | None) -> bool:
    """True when ``peer`` (a connection's remote address) is on this machine's loopback."""
    if not peer:
        return False
    try:
        return _ip(str(peer[0])).is_loopback
    except ValueError:
        return False


def peer_uid(peer: Address, local: Address) -> int | None:
    """The uid owning the client socket of the connection ``local`` <- ``peer``, or None."""
    try:
        client, server = _ip(str(peer[0])), _ip(str(local[0]))
    except ValueError:
        return None
    if client.version != server.version:
        return None
    pair = (client, int(peer[1]), server, int(local[1]))
    try:
        return _netlink(*pair)
    except OSError:
        pass
    try:
        return _proc(*pair)
    except OSError:
        return None


def _netlink(client: Any, cport: int, server: Any, sport: int) -> int | None:
    """The exact lookup: the socket whose own address is the client's and whose peer is
    ours (OSError when netlink is not there: not Linux, a sandbox without it)."""
    family = socket.AF_INET if client.version == 4 else socket.AF_INET6
    req = (struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _ALL_STATES)
           + struct.pack("!HH", cport, sport)
           + client.packed.ljust(16, b"\0") + server.packed.ljust(16, b"\0")
           + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))  # fmt: skip
    msg = _HEADER.pack(_HEADER.size + len(req), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(msg + req, (0, 0))
        data = nl.recv(8192)
    if len(data) < _HEADER.size:
        raise OSError(errno.EIO, "short netlink reply")
    _, kind, _, _, _ = _HEADER.unpack_from(data)
    if kind == _NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", data, _HEADER.size)
        if -code == errno.ENOENT:
            return None  # no such socket: the client left already
        raise OSError(-code, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(data) < _UID_AT + 4:
        raise OSError(errno.EIO, "unexpected netlink reply")
    (uid,) = struct.unpack_from("=I", data, _UID_AT)
    return int(uid)


def _hex(ip: Any, port: int) -> str:
    """An address as /proc/net/tcp* writes it: 32-bit words in host order, then the port."""
    words = struct.unpack(f"={len(ip.packed) // 4}I", ip.packed)
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


def _proc(client: Any, cport: int, server: Any, sport: int) -> int | None:
    """The row of /proc/net/tcp (tcp6) whose local address is the client's and whose remote
    address is ours; its 8th column is the uid."""
    table = "/proc/net/tcp" if client.version == 4 else "/proc/net/tcp6"
    with open(table) as fh:
        text = fh.read()
    at = text.find(f" {_hex(client, cport)} {_hex(server, sport)} ")
    if at < 0:
        return None
    row = text[at:text.find("\n", at)].split()
    return int(row[6]) if len(row) > 6 else None
