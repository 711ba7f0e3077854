"""``scripts/gpu-check.sh --cpu``: the card check of issue 44 end to end on this CPU build, so
that the script, the bisect, the relinks, the candidate loads and the GPU benchmark's code
cannot go stale between the rare runs on a card. A real daemon, runners, llama.cpp, linker;
no timing asserts (the numbers of a CPU run mean nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
INSERT_LONG = "_ZNSo9_M_insertIlEERSoT_"  # std::ostream::_M_insert<long>, the card's crash frame

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("gpu-out")
    env = dict(os.environ, OUT=str(out), PY=sys.executable)
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check.sh"), "--cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


def results(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "results.json").read_text()))


def test_out_holds_the_few_files_a_card_run_can_bring_back(run: tuple[Path, str]) -> None:
    out, stdout = run
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu.json",
        "logs.tar.gz",
        "results.json",
        "summary.md",
    ]
    summary = (out / "summary.md").read_text()
    assert summary.strip() in stdout  # printed too: the last 12,000 characters come back
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = tar.getnames()
    for want in (
        "logs/candidate-default.log",
        "logs/theory.log",
        "bench/gpu.jsonl",
        "bisect.jsonl",
    ):
        assert want in names, names


def test_every_step_ran_in_time(run: tuple[Path, str]) -> None:
    steps = results(run[0])["steps"]
    want = ["facts", "bindings-plain", "bindings-zmq", "probe-build", "theory", "pytest", "bench"]
    want += [
        f"candidate-{c}" for c in ("default", "hide-std", "exclude-libs", "preload", "ld-preload")
    ]
    assert {n: steps.get(n, {}).get("status") for n in want} == dict.fromkeys(want, "ok")


def test_the_facts_name_libraries_and_where_their_std_references_bind(
    run: tuple[Path, str],
) -> None:
    facts = results(run[0])["facts"]
    llama = next(v for k, v in facts["libraries"].items() if k.startswith("libllama.so"))
    assert "libstdc++.so.6" in llama["needed"] and llama["std_exports"] > 0
    assert facts["pyzmq"], "pyzmq's own libraries are listed"
    for key in ("bindings-plain", "bindings-zmq"):
        targets = facts[f"{key}-std-targets"]
        assert targets.get("libllama.so -> libstdc++.so.6", 0) > 0, targets


def test_the_relinks_tell_which_flag_removes_which_copy(run: tuple[Path, str]) -> None:
    """The probe library defines _M_insert<long> itself and takes std:: code from an archive:
    --exclude-libs hides only the archive's, the version script hides both, the API stays."""
    probe = results(run[0])["relink"]["probe"]
    assert INSERT_LONG in probe["default"]["watched"] and probe["default"]["std_exports"] > 100
    assert (
        INSERT_LONG in probe["exclude-libs"]["watched"] and probe["exclude-libs"]["std_exports"] < 5
    )
    assert probe["hide-std"]["watched"] == [] and probe["hide-std"]["std_exports"] == 0


def test_each_candidate_loads_a_model_in_a_real_runner(run: tuple[Path, str]) -> None:
    r = results(run[0])
    for name, row in r["candidates"].items():
        assert row.get("loaded") is True and row["processor"] == "100% CPU", (name, row)
    assert r["chosen"] == "default"
    theory = {line.split()[0]: line.split()[1] for line in r["theory"][:4]}
    assert theory == dict.fromkeys(
        ("plain", "plain+zmq", "plain+stdcxx+zmq", "plain+zmq_after"), "ok"
    )
    assert "skipped" in r["pytest"]  # the gpu tests skip without a card, and say so


def test_the_benchmark_writes_every_row_without_a_card(run: tuple[Path, str]) -> None:
    gpu = json.loads((run[0] / "gpu.json").read_text())
    assert gpu["cpu_check"] is True and gpu["vram"] == []  # no NVML rows on the CPU
    rows = {(m["clients"], m["gpu_layers"]) for m in gpu["modeld"]}
    assert rows == {(1, -1), (4, -1), (8, -1), (1, 1)}, gpu["modeld"]
    assert all(m["aggregate_tok_s"] > 0 and m["tokens"] > 0 for m in gpu["modeld"])
    assert gpu["cold_load"]["wall_s"] > 0 and gpu["ttft"]["modeld_s"] > 0
    # only the llama-server rows may be missing (no llama-server built here): said, not dropped
    assert all(e.get("kind") == "server" and "llama-server" in e["error"] for e in gpu["errors"]), (
        gpu["errors"]
    )


def test_a_step_past_its_deadline_is_stopped_with_its_children(tmp_path: Path) -> None:
    """A slow step cannot eat the rest: at its deadline its process group is killed (a
    daemon it started too), and a step with no time left is skipped, both said."""
    sys.path.insert(0, str(ROOT / "bench"))
    import time

    from gpu_steps import Steps

    st = Steps(tmp_path, tmp_path, deadline=time.time() + 17, reserve=10)
    pid_file = tmp_path / "grandchild.pid"
    done = st.sh("slow", ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], limit=60)
    assert done is not None and st.results["steps"]["slow"]["status"].startswith("timed out")
    grandchild = int(pid_file.read_text())
    for _ in range(50):
        if not Path(f"/proc/{grandchild}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{grandchild}").exists()
    assert st.sh("late", ["true"], limit=60) is None
    assert st.results["steps"]["late"] == {"status": "skipped: out of time"}


def test_the_verdict_follows_the_candidates() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_check import verdict

    def rows(*ok: str) -> dict[str, dict[str, Any]]:
        names = ("default", "hide-std", "exclude-libs", "preload", "ld-preload")
        return {n: {"loaded": n in ok} for n in names}

    assert "no crash" in verdict(rows("default", "hide-std"))
    assert "no candidate loads" in verdict(rows())
    text = verdict(rows("hide-std", "preload"))
    assert "MODELD_CUDA_LINK=hide-std" in text and "not enough" in text and "interposition" in text
    assert "static archive" in verdict(rows("hide-std", "exclude-libs"))
