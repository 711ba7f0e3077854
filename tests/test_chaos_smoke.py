"""The chaos benchmark's smoke run (bench/chaos.py, 60 s): faults are injected and afterwards
nothing is lost, mixed or leaked, the daemon answers and memory stayed inside the budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_chaos_smoke_run_loses_nothing(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "chaos.py"), "--duration", "60", "--seed", "1",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads((tmp_path / "chaos.json").read_text())
    detail = json.dumps({k: doc[k] for k in ("outcomes", "faults", "leaked", "examples")})
    assert doc["requests"] > 50, detail
    assert sum(doc["faults"].values()) >= 5 and len(doc["faults"]) >= 3, detail
    assert doc["lost"] == 0 and doc["hung_threads"] == 0, detail
    assert doc["mixed"] == 0, detail
    assert doc["leaked"]["runners"] == 0 and doc["leaked"]["fds"] == 0, detail
    assert doc["daemon_alive"] is True
    assert doc["samples"] > 100 and doc["samples_over_budget"] == 0, detail
    assert doc["peak_rss_bytes"] <= doc["budget_bytes"]
    # issue 21: lone surrogates refused, callers that leave stop their work, nothing wedged
    assert doc["outcomes"]["bad_text"] == {"error:invalid_request": doc["outcomes"][
        "bad_text"].get("error:invalid_request", 0)}, detail
    assert doc["wedged_models"] == doc["leave_wedged_models"] == [], detail
    assert doc["leave_wedged"] == 0, detail
    assert doc["bad_text"]["other"] == 0, doc["bad_text"]
    assert doc["bad_text"]["streams_beside_ok"] == doc["bad_text"]["streams"] >= 1
    assert doc["disconnect_to_idle_all_s"]["n"] == doc["leave_trials"] >= 3
    # issue 35: heavy and hostile requests get their typed answer or their reply, nothing else
    heavy = doc["outcomes"].get("heavy", {})
    assert all(k == "done" or k.startswith("error:") for k in heavy), heavy
    done = sum(v.get("done", 0) for v in doc["outcomes"].values())
    assert done > doc["requests"] // 2, detail  # mostly served, not mostly refused
