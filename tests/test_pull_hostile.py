"""A hostile hub (issue 35, findings 1 and 2): its listing chooses the hashes, names and sizes
a pull acts on. Through the real console script and a real daemon's ``/api/pull``, against the
loopback fake hub (tests/fakehub.py) lying in its listing: every bad field is a clear error
before anything is written, no file outside the models dir is created, changed or deleted
(``..``, absolute paths, links planted in ``.partial/``, NUL, newline), failed and stopped
pulls leave no lock file and no empty folder, one repository's partial file is never taken
for another's, and abandoned partial files are swept by age."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cliutil import CliEnv
from daemonutil import until
from fakehub import FakeHub, Fault, HubFile
from modeld.errors import ExitCode
from modeld.pull.download import Transfer
from test_http import _answers, free_port

Q4 = "m-Q4_K_M.gguf"
DATA = b"GGUF" + bytes(range(256)) * 40  # 10 KiB: a "model" the fake hub serves
EMPTY_SHA = hashlib.sha256(b"").hexdigest()


@pytest.fixture()
def outside(cli: CliEnv) -> Path:
    """A folder beside the models dir (``cli`` and ``hub``: conftest.py) with files a lying
    listing points at."""
    folder = cli.root / "outside"
    folder.mkdir()
    (folder / "victim").write_bytes(b"precious")
    (folder / "victim.part").write_bytes(b"precious partial")
    return folder


def snapshot(folder: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``folder``: kind, size, mtime and content hash (links not followed)."""
    out: dict[str, tuple[Any, ...]] = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        if p.is_symlink():
            out[str(p)] = ("link", os.readlink(p))
        elif p.is_file():
            out[str(p)] = ("file", st.st_size, st.st_mtime_ns,
                           hashlib.sha256(p.read_bytes()).hexdigest())  # fmt: skip
        else:
            out[str(p)] = ("dir",)
    return out


def models(cli: CliEnv) -> Path:
    return cli.root / "models"


def model_files(cli: CliEnv) -> list[str]:
    """What the pull left in the models dir (``.partial/`` itself aside)."""
    return sorted(str(p.relative_to(models(cli))) for p in models(cli).rglob("*")
                  if p.name != ".partial")  # fmt: skip


def partial(hub: FakeHub, repo: str, name: str = Q4, models_dir: Path = Path("/m")) -> Path:
    """Where a pull of ``repo``'s file keeps its partial download."""
    f = hub.file(repo, name)
    t = Transfer(url="", size=f.size, sha256=f.sha256, git_oid=f.git_oid, target=Path("/x"),
                 models_dir=models_dir, repo_id=repo)  # fmt: skip
    return t.partial


OUTSIDE = "../outside/victim"  # from <models>/.partial/: <root>/outside/victim(.part|.lock)


def _lies(root: Path) -> dict[str, tuple[str, HubFile]]:
    absolute = str(root / "outside" / "victim")
    return {
        "sha256 ..": (Q4, HubFile(data=DATA, listed={"lfs": {"oid": OUTSIDE}})),
        "sha256 deep ..": (Q4, HubFile(data=DATA, listed={"lfs": {"oid": "../" * 12 + absolute}})),
        "sha256 absolute": (Q4, HubFile(data=DATA, listed={"lfs": {"oid": absolute}})),
        "sha256 NUL": (Q4, HubFile(data=DATA, listed={"lfs": {"oid": "a" * 63 + "\0"}})),
        "git oid ..": (Q4, HubFile(data=DATA, lfs=False, listed={"oid": OUTSIDE})),
        "git oid newline": (Q4, HubFile(data=DATA, lfs=False, listed={"oid": "b" * 39 + "\n"})),
        "name NUL": ("m-Q4_K_M\0x.gguf", HubFile(data=DATA)),
        "name newline": ("m-Q4_K_M\nx.gguf", HubFile(data=DATA)),
        "name ..": (f"../../outside/{Q4}", HubFile(data=DATA)),
        "name hidden": (f".{Q4}", HubFile(data=DATA)),
        "size -5, empty hash": (Q4, HubFile(data=DATA, listed={
            "size": -5, "lfs": {"oid": EMPTY_SHA, "size": -5}})),
        "size 0, empty hash": (Q4, HubFile(data=DATA, listed={
            "size": 0, "lfs": {"oid": EMPTY_SHA, "size": 0}})),
    }  # fmt: skip


NEEDLES = {"sha256": "is not 64 hex digits", "git oid": "is not 40 hex digits",
           "name NUL": "control character", "name newline": "control character",
           "name ..": "'..' component", "name hidden": "starts with a dot",
           "size": "a GGUF file has at least 24"}  # fmt: skip


@pytest.mark.parametrize("lie", list(_lies(Path("/r"))))
def test_a_lying_listing_is_refused_before_anything_is_written(cli: CliEnv, hub: FakeHub,
                                                               outside: Path, lie: str) -> None:
    name, hub_file = _lies(cli.root)[lie]  # a Q4_K_M file, the one the pull chooses
    hub.add("org/r", {name: hub_file})
    before = snapshot(cli.root / "outside")
    out = cli.run("pull", "org/r:Q4_K_M", "--json")
    assert out.returncode == ExitCode.VERIFICATION_FAILED, (out.returncode, out.stderr)
    needle = next(v for k, v in NEEDLES.items() if lie.startswith(k))
    assert "listing of org/r is not valid" in out.stderr and needle in out.stderr
    assert "Traceback" not in out.stderr
    err = json.loads(out.stdout[out.stdout.index("{\n"):])["error"]
    assert err["code"] == "verification_failed" and err["details"]["repo"] == "org/r"
    assert snapshot(cli.root / "outside") == before  # nothing outside created/changed/deleted
    assert model_files(cli) == []  # and nothing inside: no folder, no .part, no .lock
    assert hub.downloads("org/r", name) == []


def test_api_pull_refuses_a_lying_listing_with_a_status_not_a_500(
        daemon_factory: Any, hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    victim = tmp_path / "outside" / "victim.part"
    victim.write_bytes(b"precious")
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}",
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")})
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    rel = os.path.relpath(tmp_path / "outside" / "victim", d.root / "models" / ".partial")
    hub.add("org/trav", {Q4: HubFile(data=DATA, listed={"lfs": {"oid": rel}})})
    hub.add("org/nul", {"m-Q4_K_M\0.gguf": HubFile(data=DATA)})
    before = snapshot(tmp_path / "outside")
    base = f"http://127.0.0.1:{port}"
    for repo, needle in (("org/trav", "is not 64 hex digits"), ("org/nul", "control character")):
        for stream in (True, False):
            r = httpx.post(f"{base}/api/pull", json={"model": f"hf.co/{repo}:Q4_K_M",
                                                     "stream": stream}, timeout=30)
            assert r.status_code == 502, r.text  # the hub sent garbage: a bad gateway
            assert needle in r.json()["error"] and "not valid" in r.json()["error"]
    assert snapshot(tmp_path / "outside") == before and victim.read_bytes() == b"precious"
    assert not [p for p in (d.root / "models").rglob("*") if p.name != ".partial"]
    assert "Traceback" not in d.log_text()
    assert httpx.get(f"{base}/api/tags", timeout=10).status_code == 200  # still serving


def test_links_planted_in_partial_or_the_repo_folder_are_never_followed(
        cli: CliEnv, hub: FakeHub, outside: Path) -> None:
    hub.add("org/r", {Q4: DATA})
    part = partial(hub, "org/r", models_dir=models(cli))
    part.parent.mkdir(parents=True)
    part.symlink_to(outside / "victim.part")  # a link where the partial download goes
    part.with_suffix(".lock").symlink_to(outside / "victim.lock")
    before = snapshot(outside)
    out = cli.run("pull", "org/r", "--quiet")
    assert out.returncode == 0, out.stderr  # the links were swept (unlinked, not followed)
    assert Path(out.stdout.strip()).read_bytes() == DATA
    assert snapshot(outside) == before
    assert not part.exists() and not part.is_symlink()
    # the repository's folder is a link to outside: refused, nothing written there
    hub.add("org/s", {Q4: DATA})
    (models(cli) / "org" / "s").symlink_to(outside, target_is_directory=True)
    out = cli.run("pull", "org/s")
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert "outside the models dir" in out.stderr and "remove that link" in out.stderr
    assert snapshot(outside) == before and hub.downloads("org/s", Q4) == []
    # .partial itself is a link to outside: refused the same way
    (models(cli) / "org" / "s").unlink()
    (models(cli) / ".partial").rename(models(cli) / ".old")
    (models(cli) / ".partial").symlink_to(outside, target_is_directory=True)
    out = cli.run("pull", "org/s")
    assert out.returncode == ExitCode.USAGE and "outside the models dir" in out.stderr
    assert snapshot(outside) == before and hub.downloads("org/s", Q4) == []


def test_sigterm_during_a_stalled_pull_leaves_no_lock_and_nothing_outside(
        cli: CliEnv, hub: FakeHub, outside: Path) -> None:
    data = DATA * 4  # 40 KiB: 4 KiB arrive, then the hub stalls for 20 s
    hub.add("org/stall", {Q4: HubFile(data=data, fault=Fault(bytes_per_s=200))})
    before = snapshot(cli.root / "outside")
    proc = cli.popen("pull", "org/stall", stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = partial(hub, "org/stall", models_dir=models(cli))
    until(lambda: part.exists() and part.stat().st_size > 0, timeout=30,
          what="the first bytes")  # fmt: skip
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 5  # not the hub's stall, nor the 60 s read timeout
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert b"it resumes" in err
    assert snapshot(cli.root / "outside") == before
    assert model_files(cli) == [f".partial/{part.name}"]  # kept to resume; no lock, no folder


def test_failed_pulls_leave_no_lock_file_and_no_empty_folder(cli: CliEnv, hub: FakeHub) -> None:
    hub.add("org/bad", {Q4: HubFile(data=DATA, fault=Fault(flip_byte_at=77))})
    hub.add("org/gone", {Q4: HubFile(data=DATA, fault=Fault(status=404))})
    hub.add("org/drop", {Q4: HubFile(data=DATA, fault=Fault(drop_after=5000, drop_times=99))})
    for repo, code in (("org/bad", ExitCode.VERIFICATION_FAILED),
                       ("org/gone", ExitCode.MODEL_NOT_FOUND), ("org/drop", ExitCode.NETWORK)):
        out = cli.run("pull", repo)
        assert out.returncode == code, (repo, out.stderr)
    kept = partial(hub, "org/drop", models_dir=models(cli)).name  # resumable: kept
    assert model_files(cli) == [f".partial/{kept}"]


def test_one_repositorys_partial_file_is_not_taken_for_anothers(cli: CliEnv,
                                                               hub: FakeHub) -> None:
    """A complete partial file of org/a (a pull stopped just before its rename) is not
    renamed into org/b, whose listing names the same SHA-256: org/b downloads its own."""
    hub.add("org/a", {Q4: DATA})
    hub.add("org/b", {Q4: DATA})
    part_a = partial(hub, "org/a", models_dir=models(cli))
    part_a.parent.mkdir(parents=True)
    part_a.write_bytes(DATA)
    out = cli.run("pull", "org/b", "--json")
    assert out.returncode == 0, out.stderr
    assert hub.sent_bytes("org/b", Q4) == len(DATA)
    assert part_a.read_bytes() == DATA  # untouched
    out = cli.run("pull", "org/a", "--json")  # org/a's own pull finishes from its partial
    assert out.returncode == 0, out.stderr
    done = next(json.loads(x) for x in out.stdout.splitlines() if '"file_done"' in x)
    assert done["resumed_from"] == len(DATA) and done["fetched_bytes"] == 0
    assert hub.sent_bytes("org/a", Q4) == 0
    assert model_files(cli) == ["org", "org/a", f"org/a/.{Q4}.pull.json", f"org/a/{Q4}",
                                "org/b", f"org/b/.{Q4}.pull.json", f"org/b/{Q4}"]


def test_abandoned_partial_files_are_swept_by_age(cli: CliEnv, hub: FakeHub) -> None:
    hub.add("org/r", {Q4: DATA})
    folder = models(cli) / ".partial"
    folder.mkdir(parents=True)
    now = time.time()

    def plant(name: str, age_s: float) -> Path:
        p = folder / name
        p.write_bytes(b"x" * 100)
        os.utime(p, (now - age_s, now - age_s))
        return p

    old = plant("a" * 64 + ".0000000000000000.part", 3 * 3600)
    young = plant("b" * 64 + ".0000000000000000.part", 600)
    held = plant("c" * 64 + ".0000000000000000.part", 3 * 3600)
    stale_lock = plant("d" * 64 + ".0000000000000000.lock", 10)
    other = plant("notes.txt", 3 * 3600)  # not modeld's: left alone
    with open(held.with_suffix(".lock"), "a+b") as lock:  # a pull running now holds it
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        out = cli.run("pull", "org/r", env_extra={"MODELD_PARTIAL_MAX_AGE": "3600"})
        assert out.returncode == 0, out.stderr
        assert held.exists() and held.with_suffix(".lock").exists()
    assert not old.exists() and not stale_lock.exists()
    assert young.exists() and other.exists()
    out = cli.run("config", "--json", env_extra={"MODELD_PARTIAL_MAX_AGE": "-1"})
    assert out.returncode == ExitCode.USAGE and "must not be negative" in out.stderr


def test_a_daemon_stopped_during_a_stalled_pull_exits_and_leaves_no_lock(
        daemon_factory: Any, hub: FakeHub, tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "victim").write_bytes(b"precious")
    hub.add("org/stall", {Q4: HubFile(data=DATA * 4, fault=Fault(bytes_per_s=200))})
    port = free_port()
    d = daemon_factory("--http", f"127.0.0.1:{port}",
                       env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf")})
    until(lambda: _answers(port), timeout=30, what="the HTTP front door")
    before = snapshot(tmp_path / "outside")
    with httpx.stream("POST", f"http://127.0.0.1:{port}/api/pull", timeout=30,
                      json={"model": "hf.co/org/stall"}) as r:
        for line in r.iter_lines():
            if json.loads(line).get("completed"):
                break  # bytes arrived; the hub now stalls for 20 s
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        d.proc.wait(30)
        took = time.monotonic() - t0
    assert d.proc.returncode == 0, d.log_text()
    assert took < 8, took  # not held by the hub's stall (nor the 60 s read timeout)
    assert snapshot(tmp_path / "outside") == before
    part = partial(hub, "org/stall", models_dir=d.root / "models")
    left = sorted(p.name for p in (d.root / "models").rglob("*"))
    assert left == [".partial", part.name], left  # kept to resume; no lock file
