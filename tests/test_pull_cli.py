"""``modeld pull`` / ``rm`` and the pull inside ``run``, through the real console script
against a loopback fake hub (tests/fakehub.py, ``HF_ENDPOINT``) serving generated GGUFs, with
faults injected by the server: a dropped connection, a flipped byte, 404, 401/gated, a slow
stream with Ctrl-C or a killed process, a full disk, two pulls of one file at once."""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cliutil import GREEDY, MODELD, CliEnv
from daemonutil import until
from fakehub import FakeHub, Fault, HubFile
from modeld.errors import ExitCode

Q4 = "m-Q4_K_M.gguf"


def models(cli: CliEnv) -> Path:
    return cli.root / "models"


def visible_files(cli: CliEnv) -> list[str]:
    """What list/run could see: every non-hidden file under the models dir."""
    return sorted(str(p.relative_to(models(cli))) for p in models(cli).rglob("*")
                  if p.is_file() and not any(part.startswith(".")
                                             for part in p.relative_to(models(cli)).parts))


def lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_pull_default_quant_layout_list_json_quiet_and_no_second_download(
        cli: CliEnv, hub: FakeHub, tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    hub.add("org/tiny-GGUF", {Q4: data, "m-Q8_0.gguf": data[:4096] + b"x", "README.md": b"hi"})
    out = cli.run("pull", "hf.co/org/tiny-GGUF", "--json")
    assert out.returncode == 0, out.stderr
    events = lines(out.stdout)
    assert {e["kind"] for e in events} == {"pull"} and events[-1]["event"] == "success"
    chosen = next(e for e in events if e["event"] == "chosen")
    assert (chosen["quant"], chosen["reason"], chosen["model"]) == \
        ("Q4_K_M", "default", "hf.co/org/tiny-GGUF:Q4_K_M")
    sha = hub.file("org/tiny-GGUF", Q4).sha256
    assert chosen["files"] == [{"file": Q4, "size": len(data), "digest": f"sha256:{sha}"}]
    assert any(e["event"] == "progress" for e in events)
    path = models(cli) / "org" / "tiny-GGUF" / Q4
    assert events[-1]["path"] == str(path) and path.read_bytes() == data
    assert visible_files(cli) == [f"org/tiny-GGUF/{Q4}"]
    listed = [m for m in cli.json("list")["models"] if m["source"] == "models_dir"]
    assert [(m["name"], m["size"], m["hub_name"], m["sha256"]) for m in listed] == \
        [("m-Q4_K_M", len(data), "hf.co/org/tiny-GGUF:Q4_K_M", sha)]
    assert "hf.co/org/tiny-GGUF:Q4_K_M" in cli.run("list", env_extra={"COLUMNS": "200"}).stdout
    # pulled again: the verified file is there, nothing is downloaded; --quiet prints the path
    sent = hub.sent_bytes("org/tiny-GGUF", Q4)
    out = cli.run("pull", "org/tiny-GGUF:q4_k_m", "--quiet")
    assert (out.returncode, out.stdout) == (0, f"{path}\n"), out.stderr
    assert hub.sent_bytes("org/tiny-GGUF", Q4) == sent == len(data)
    # the name resolves for show (and so for run/load and the HTTP APIs)
    shown = cli.json("show", "org/tiny-GGUF:Q4_K_M")
    assert shown["path"] == str(path.resolve())


def test_pull_says_which_quant_it_took_and_fetches_every_shard(cli: CliEnv,
                                                              hub: FakeHub) -> None:
    shards = {f"Q8_0/big-Q8_0-0000{i}-of-00003.gguf": bytes([i]) * 70_000 for i in (1, 2, 3)}
    hub.add("org/split", {**shards, "big-F16.gguf": b"f" * 1000})
    out = cli.run("pull", "org/split")
    assert out.returncode == 0, out.stderr
    assert "has no Q4_K_M; taking Q8_0, the best one listed in 3 shards" in out.stderr
    assert out.stdout.startswith("pulled hf.co/org/split:Q8_0 (205.1 KiB): ")
    assert visible_files(cli) == [f"org/split/big-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    listed = [m for m in cli.json("list")["models"] if m["source"] == "models_dir"]
    assert [(m["name"], m["size"]) for m in listed] == [("big-Q8_0", 210_000)]


def test_a_dropped_connection_resumes_without_refetching(cli: CliEnv, hub: FakeHub,
                                                        tiny_model: Path) -> None:
    data = tiny_model.read_bytes()
    fault = Fault(drop_after=len(data) // 2, redirect=True)  # the Range survives the 302
    hub.add("org/r", {Q4: HubFile(data=data, fault=fault)})
    out = cli.run("pull", "org/r:Q4_K_M", "--json")
    assert out.returncode == 0, out.stderr
    ranges = [None, f"bytes={len(data) // 2}-"]
    assert hub.downloads("org/r", Q4) == hub.downloads("org/r", Q4, cdn=True) == ranges
    assert hub.sent_bytes("org/r", Q4) <= 1.1 * len(data)
    assert (models(cli) / "org" / "r" / Q4).read_bytes() == data


def test_a_server_that_ignores_range_gets_the_whole_file_again(cli: CliEnv,
                                                               hub: FakeHub) -> None:
    data = bytes(range(241)) * 1000
    fault = Fault(drop_after=len(data) // 2, ignore_range=True)
    hub.add("org/r", {Q4: HubFile(data=data, fault=fault)})
    out = cli.run("pull", "org/r", "--quiet")
    assert out.returncode == 0, out.stderr
    assert hub.downloads("org/r", Q4) == [None, f"bytes={len(data) // 2}-"]
    assert hub.sent_bytes("org/r", Q4) == len(data) // 2 + len(data)  # a 200: from byte 0
    assert Path(out.stdout.strip()).read_bytes() == data


def test_a_corrupted_byte_fails_verification_and_leaves_no_file(cli: CliEnv,
                                                               hub: FakeHub) -> None:
    data = bytes(range(256)) * 1000
    hub.add("org/r", {Q4: HubFile(data=data, fault=Fault(flip_byte_at=12345))})
    out = cli.run("pull", "org/r", "--json")
    assert out.returncode == ExitCode.VERIFICATION_FAILED == 13, out.stderr
    sha = hub.file("org/r", Q4).sha256
    err = json.loads(out.stdout[out.stdout.index("{\n"):])["error"]  # after the event lines
    assert err["code"] == "verification_failed" and err["details"]["expected"] == sha
    assert sha in out.stderr and err["details"]["actual"] in out.stderr
    assert visible_files(cli) == [] and not list(models(cli).rglob("*.part"))
    assert cli.json("list")["models"] == [] or all(
        m["source"] != "models_dir" for m in cli.json("list")["models"])


@pytest.mark.parametrize(
    ("setup", "code", "needle"),
    [
        ("no_repo", ExitCode.MODEL_NOT_FOUND, "no repository org/none"),
        ("no_quant", ExitCode.MODEL_NOT_FOUND, "has no Q2_K file (it has: Q4_K_M)"),
        ("gated", ExitCode.UNAUTHORIZED, "set HF_TOKEN"),
        ("forbidden", ExitCode.UNAUTHORIZED, "set HF_TOKEN"),
        ("private", ExitCode.MODEL_NOT_FOUND, "set HF_TOKEN"),
        ("offline", ExitCode.NETWORK, "HF_HUB_OFFLINE"),
        ("bad_name", ExitCode.USAGE, "hf.co/ORG/REPO[:QUANT]"),
    ],
)
def test_hub_errors_have_documented_exit_codes_and_hints(cli: CliEnv, hub: FakeHub,
                                                         setup: str, code: int,
                                                         needle: str) -> None:
    hub.add("org/r", {Q4: b"x" * 100})
    hub.add("org/gated", {Q4: HubFile(data=b"x" * 100,
                                      fault=Fault(status=401, error_code="GatedRepo"))})
    hub.add("org/forbidden", {Q4: HubFile(data=b"x" * 100, fault=Fault(status=403))})
    private = hub.add("org/private", {})
    private.tree_status, private.tree_error_code = 401, "RepoNotFound"  # what the hub sends
    ref, extra = {"no_repo": ("org/none", {}), "no_quant": ("org/r:Q2_K", {}),
                  "gated": ("org/gated", {}), "forbidden": ("org/forbidden", {}),
                  "private": ("hf.co/org/private", {}),
                  "offline": ("org/r", {"HF_HUB_OFFLINE": "1"}),
                  "bad_name": ("llama3.2", {})}[setup]  # fmt: skip
    out = cli.run("pull", ref, env_extra=extra)
    assert out.returncode == code, (out.returncode, out.stderr)
    assert needle in out.stderr
    assert visible_files(cli) == []


def _slow(hub: FakeHub, data: bytes, rate: float) -> None:
    hub.add("org/slow", {Q4: HubFile(data=data, fault=Fault(bytes_per_s=rate))})


def _wait_partial(cli: CliEnv, at_least: int) -> None:
    def grown() -> bool:
        parts = list(models(cli).rglob("*.part"))
        return bool(parts) and parts[0].stat().st_size >= at_least
    until(grown, timeout=30, what="the partial file to grow")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_ctrl_c_or_a_killed_pull_resumes_where_it_stopped(cli: CliEnv, hub: FakeHub,
                                                         sig: int) -> None:
    data = bytes(range(251)) * 1200  # ~300 KB at 150 KB/s: stopped after about a third
    _slow(hub, data, 150_000)
    proc = cli.popen("pull", "org/slow", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _wait_partial(cli, 60_000)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    if sig == signal.SIGINT:
        assert proc.returncode == ExitCode.INTERRUPTED == 130, err
        assert b"it resumes" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    assert visible_files(cli) == []  # the partial file is hidden from list and run
    kept = next(models(cli).rglob("*.part")).stat().st_size
    assert 0 < kept < len(data)
    hub.file("org/slow", Q4).fault.bytes_per_s = None
    out = cli.run("pull", "org/slow", "--json")
    assert out.returncode == 0, out.stderr
    done = next(e for e in lines(out.stdout) if e["event"] == "file_done")
    assert done["resumed_from"] == kept and done["fetched_bytes"] == len(data) - kept
    assert hub.downloads("org/slow", Q4)[-1] == f"bytes={done['resumed_from']}-"
    assert hub.sent_bytes("org/slow", Q4) <= 1.1 * len(data)
    assert (models(cli) / "org" / "slow" / Q4).read_bytes() == data


def test_two_pulls_of_one_file_share_one_download(cli: CliEnv, hub: FakeHub) -> None:
    data = bytes(range(199)) * 3000  # ~600 KB at 100 KB/s: the second starts well before (6 s)
    _slow(hub, data, 100_000)
    first = cli.popen("pull", "org/slow", "--json", stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE)
    _wait_partial(cli, 1)
    second = cli.popen("pull", "org/slow", "--json", stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE)
    outs = [p.communicate(timeout=60) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], outs
    assert len(hub.downloads("org/slow", Q4)) == 1
    assert hub.sent_bytes("org/slow", Q4) == len(data)
    waited = lines(outs[1][0].decode())
    assert any(e.get("phase") == "waiting" for e in waited)
    assert next(e for e in waited if e["event"] == "file_done")["shared"] is True
    assert waited[-1]["path"] == lines(outs[0][0].decode())[-1]["path"]


def test_not_enough_disk_is_refused_before_the_first_byte(cli: CliEnv, hub: FakeHub) -> None:
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unprivileged user namespaces (unshare -rm) to mount a small tmpfs")
    hub.add("org/r", {Q4: b"z" * 3_000_000})
    small = models(cli)
    script = (f"mount -t tmpfs -o size=2m tmpfs {small} && "
              f"exec {MODELD} pull org/r --json")  # fmt: skip
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script], env=cli.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == ExitCode.DISK_FULL == 12, out.stderr
    assert "not enough free disk" in out.stderr and "2.9 MiB" in out.stderr
    assert hub.sent_bytes("org/r", Q4) == 0


def test_disk_full_while_writing_is_a_disk_full_error(cli: CliEnv, hub: FakeHub) -> None:
    hub.add("org/r", {Q4: b"z" * 3_000_000})

    def quota() -> None:  # a file-size quota of 1 MB for the pull process
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    out = subprocess.run([MODELD, "pull", "org/r"], env=cli.env, capture_output=True,
                         text=True, timeout=60, preexec_fn=quota, stdin=subprocess.DEVNULL)
    assert out.returncode == ExitCode.DISK_FULL, out.stderr
    assert "the disk is full while writing" in out.stderr and "it resumes" in out.stderr
    assert visible_files(cli) == []


def test_run_pulls_a_missing_hub_model_unless_told_not_to(cli: CliEnv, hub: FakeHub,
                                                         tiny_model: Path) -> None:
    hub.add("org/tiny", {Q4: tiny_model.read_bytes()})
    cli.serve()
    try:
        out = cli.run("run", "hf.co/org/tiny:Q4_K_M", "hello", "--no-pull")
        assert out.returncode == ExitCode.MODEL_NOT_FOUND, out.stderr
        assert "modeld pull hf.co/org/tiny:Q4_K_M" in out.stderr
        out = cli.run("load", "hf.co/org/tiny", env_extra={"MODELD_NO_PULL": "1"})
        assert out.returncode == ExitCode.MODEL_NOT_FOUND, out.stderr
        assert hub.sent_bytes("org/tiny", Q4) == 0
        out = cli.run("run", "hf.co/org/tiny:Q4_K_M", "hello", "--max-tokens", "4", *GREEDY)
        assert out.returncode == 0, out.stderr
        assert "is not here yet: pulling it" in out.stderr and "verified" in out.stderr
        assert out.stdout  # generated text
        path = models(cli) / "org" / "tiny" / Q4
        assert cli.ps_row(path) is not None
        # rm refuses a loaded model; --force unloads it first
        out = cli.run("rm", "org/tiny:Q4_K_M")
        assert out.returncode == ExitCode.USAGE and "--force" in out.stderr
        assert path.exists()
        doc = cli.json("rm", "--force", "org/tiny:Q4_K_M")
        assert doc["removed"] == [str(path)] and doc["unloaded"] is True
        assert not (models(cli) / "org").exists() and cli.ps_row(path) is None
        out = cli.run("rm", "org/tiny:Q4_K_M")
        assert out.returncode == ExitCode.MODEL_NOT_FOUND
    finally:
        cli.stop_and_check()


def test_rm_deletes_only_inside_the_models_dir(cli: CliEnv, tiny_model: Path) -> None:
    out = cli.run("rm", str(tiny_model))
    assert out.returncode == ExitCode.USAGE and "outside the models dir" in out.stderr
    assert tiny_model.exists()
    copy = models(cli) / "mine.gguf"
    copy.write_bytes(b"GGUF")
    out = cli.run("rm", "mine")
    assert out.returncode == 0, out.stderr  # no daemon: nothing can be loaded
    assert not copy.exists()


def test_pull_prints_a_progress_bar_on_a_terminal(cli: CliEnv, hub: FakeHub) -> None:
    import os
    import pty

    hub.add("org/r", {Q4: b"q" * 2_500_000})
    leader, follower = pty.openpty()
    proc = subprocess.Popen([MODELD, "pull", "org/r"], env=dict(cli.env, COLUMNS="100"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    out, _ = proc.communicate(timeout=60)
    seen = b""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.returncode == 0
    text = seen.decode(errors="replace")
    assert Q4 in text and "2.5/2.5 MB" in text  # rich's DownloadColumn: bytes done/total
    assert out.decode().startswith("pulled hf.co/org/r:Q4_K_M (2.4 MiB): ")


def test_a_gated_model_downloads_with_hf_token(cli: CliEnv, hub: FakeHub) -> None:
    """The token goes to the hub, never to the CDN its redirect points at (signed URLs refuse
    a second credential)."""
    fault = Fault(token="hf_secret", redirect=True)
    hub.add("org/gated", {Q4: HubFile(data=b"g" * 5000, fault=fault)})
    out = cli.run("pull", "org/gated")
    assert out.returncode == ExitCode.UNAUTHORIZED and "set HF_TOKEN" in out.stderr
    out = cli.run("pull", "org/gated", "--quiet", env_extra={"HF_TOKEN": "hf_secret"})
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).read_bytes() == b"g" * 5000
    assert "Bearer hf_secret" in hub.auth_seen
    assert hub.sent_bytes("org/gated", Q4) == 5000  # served by the CDN path, after the 302


def test_huggingface_hub_own_download_checks_only_the_size(hub: FakeHub, tmp_path: Path,
                                                           monkeypatch: Any) -> None:
    """Why modeld fetches the bytes itself (measured with huggingface_hub 2.4.0): its
    hf_hub_download, served by the same fake hub, accepts a file with one byte flipped. The
    good file downloads intact, so the fake hub answers the calls huggingface_hub makes."""
    from huggingface_hub import hf_hub_download

    data, other = bytes(range(256)) * 400, bytes(range(255, -1, -1)) * 400
    hub.add("org/r", {Q4: data, "m-Q8_0.gguf": HubFile(data=other,
                                                      fault=Fault(flip_byte_at=777))})
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    good = hf_hub_download("org/r", Q4, endpoint=hub.url, cache_dir=tmp_path, token=False)
    assert Path(good).read_bytes() == data
    bad = Path(hf_hub_download("org/r", "m-Q8_0.gguf", endpoint=hub.url, cache_dir=tmp_path,
                               token=False))
    assert bad.read_bytes() != other and bad.stat().st_size == len(other)  # accepted anyway


def test_a_file_without_lfs_is_checked_against_its_git_blob_id(cli: CliEnv,
                                                               hub: FakeHub) -> None:
    data = b"small gguf" * 100
    hub.add("org/git", {Q4: HubFile(data=data, lfs=False)})
    hub.add("org/gitbad", {Q4: HubFile(data=data, lfs=False, fault=Fault(flip_byte_at=5))})
    out = cli.run("pull", "org/git", "--quiet")
    assert out.returncode == 0 and Path(out.stdout.strip()).read_bytes() == data
    out = cli.run("pull", "org/gitbad")
    assert out.returncode == ExitCode.VERIFICATION_FAILED and "git blob id" in out.stderr
    assert hub.file("org/gitbad", Q4).git_oid in out.stderr
