"""The rules behind the front door's privacy and the smaller hostile-input items (issue 45), on
real sockets and files where they have any: who owns a loopback connection, which model
references HTTP may send, the API key's scheme, how many connections fit the descriptors,
names a terminal may print, one model per file whatever its names."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from modeld.cache.types import ModelKey
from modeld.cli.visible import visible
from modeld.config import Settings, load_settings
from modeld.errors import InvalidRequestError, ModelNotFoundError
from modeld.http import fds, peers
from modeld.http.common import model_ref
from modeld.http.security import Guard
from modeld.registry import named_ref

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's socket table")


def _pair(family: socket.AddressFamily, host: str) -> Iterator[tuple[tuple, tuple]]:
    with socket.socket(family) as srv:
        srv.bind((host, 0))
        srv.listen()
        with socket.socket(family) as client:
            client.connect(srv.getsockname()[:2])
            conn, peer = srv.accept()
            with conn:
                yield peer, conn.getsockname()


@linux
@pytest.mark.parametrize(("family", "host"), [(socket.AF_INET, "127.0.0.1"),
                                              (socket.AF_INET6, "::1")])
def test_the_owner_of_a_loopback_connection_is_found_both_ways(
        family: socket.AddressFamily, host: str) -> None:
    for peer, local in _pair(family, host):
        args = (peers._ip(peer[0]), peer[1], peers._ip(local[0]), local[1])
        assert peers._netlink(*args) == peers._proc(*args) == os.geteuid()
        assert peers.peer_uid(peer, local) == os.geteuid()
        assert peers.is_loopback_peer(peer)
        # a connection that is not there (its port moved on) is nobody's
        missing = (args[0], args[1] + 1 if args[1] < 65535 else 1, *args[2:])
        assert peers._netlink(*missing) is None and peers._proc(*missing) is None


@linux
def test_an_ipv4_client_of_a_dual_stack_listener_is_found() -> None:
    with socket.socket(socket.AF_INET6) as srv:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
        srv.listen()
        with socket.create_connection(("127.0.0.1", srv.getsockname()[1])):
            conn, peer = srv.accept()
            with conn:
                assert peer[0] == "::ffff:127.0.0.1" and peers.is_loopback_peer(peer)
                assert peers.peer_uid(peer, conn.getsockname()) == os.geteuid()
    assert not peers.is_loopback_peer(("192.0.2.1", 1)) and not peers.is_loopback_peer(None)


def test_http_names_models_never_files(tmp_path: Path) -> None:
    models = tmp_path / "models"
    for ref in ("qwen", "tiny-Q4_K_M", "hf.co/org/repo:Q4_K_M", "org/repo:Q8_0"):
        assert named_ref(ref, models) == ref
    assert named_ref("tiny.gguf", models) == str(models / "tiny.gguf")  # not the cwd's
    for ref in ("/etc/shadow", "../x.gguf", "./x.gguf", "~/m.gguf", "a/b.gguf", "x\0.gguf",
                ".hidden.gguf"):
        assert named_ref(ref, models) is None, ref
    settings = Settings(models_dir=models)
    assert model_ref("qwen:latest", settings) == "qwen" and model_ref("default", settings) is None
    with pytest.raises(ModelNotFoundError, match="not file paths") as err:
        model_ref("/" + "a" * 100_000, settings)
    assert len(err.value.message) < 400  # a 100 KB name is not echoed whole
    allowed = Settings(models_dir=models, http_model_paths=True)
    assert model_ref("/etc/x.gguf", allowed) == "/etc/x.gguf"


def test_the_bearer_scheme_is_case_free_and_the_key_is_not() -> None:
    guard = Guard(lambda *a: None, Settings(api_key="s3cret"))  # type: ignore[arg-type,return-value]

    def refused(**headers: str) -> int | None:
        got = guard._refusal({"host": "127.0.0.1", **headers}, None)
        return None if got is None else got[0]

    for value in ("Bearer s3cret", "bearer s3cret", "BEARER  s3cret", " Bearer s3cret"):
        assert refused(authorization=value) is None, value
    assert refused(**{"x-api-key": "s3cret"}) is None
    for value in ("Bearer S3CRET", "Basic s3cret", "s3cret", "Bearer", ""):
        assert refused(authorization=value) == 401, value


def test_the_http_cap_leaves_the_daemon_its_descriptors() -> None:
    for limit in (640, 1024, 4096, 1 << 20):
        cap = fds.http_cap(1024, limit)
        assert cap * fds.FDS_PER_CONNECTION + fds.BACKLOG + fds.RESERVE <= limit
    assert fds.http_cap(1024, 1 << 20) == 1024 and fds.http_cap(1024, 640) == 64


def test_http_users_key_needs_an_api_key() -> None:
    with pytest.raises(InvalidRequestError, match="http_users"):
        load_settings(env={"MODELD_HTTP_USERS": "key"}, config_path=os.devnull)
    settings, _ = load_settings(env={"MODELD_HTTP_USERS": "KEY", "MODELD_API_KEY": "k"},
                                config_path=os.devnull)
    assert settings.http_users == "key"
    with pytest.raises(InvalidRequestError, match="owner, key, all"):
        load_settings(env={"MODELD_HTTP_USERS": "everyone"}, config_path=os.devnull)


def test_names_are_printed_with_their_controls_escaped() -> None:
    assert visible("qwen2.5-0.5b") == "qwen2.5-0.5b"
    assert visible("ok\x1b[31mred\u202eflip\n") == "ok\\x1b[31mred\\u202eflip\\x0a"
    assert visible("\u2066x\u2069\u200f") == "\\u2066x\\u2069\\u200f"
    assert visible("mot café 模型") == "mot café 模型"


def test_a_hard_link_is_the_same_model(tmp_path: Path) -> None:
    first = tmp_path / "a.gguf"
    first.write_bytes(b"GGUF" + bytes(100))
    other = tmp_path / "sub" / "b.gguf"
    other.parent.mkdir()
    os.link(first, other)
    key = ModelKey.for_file(first)
    assert ModelKey.for_file(other) == key and key.path == str(first.resolve())
    first.unlink()  # the first name gone: the file is keyed by the name it still has
    assert ModelKey.for_file(other).path == str(other.resolve())
    copy = tmp_path / "c.gguf"
    copy.write_bytes(other.read_bytes())
    assert ModelKey.for_file(copy) != ModelKey.for_file(other)
