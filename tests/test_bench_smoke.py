"""The benchmark suite runs end to end and writes well-formed results (no timing asserts).

``bench/run.py --smoke`` uses tiny generated models and one round: real daemons, runners,
llama-cpp-python (and its server when installed), so a broken benchmark is caught here rather
than at the end of a 25-minute run. The trace arithmetic (Belady, LRU) is checked exactly.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import b_trace  # noqa: E402
import harness  # noqa: E402

NAMES = ("cold_load", "warm_call", "streaming", "prefix_reuse", "cli_startup", "concurrency",
         "footprint", "trace", "pull", "agent_turns")  # fmt: skip


def test_belady_and_lru_on_known_sequences() -> None:
    seq = [0, 1, 2, 0, 1, 2, 0, 1, 2]  # cyclic: LRU misses every time, Belady half of them
    assert b_trace.lru_loads(seq, 2) == 9
    assert b_trace.belady_loads(seq, 2) == 6
    assert b_trace.belady_loads([0, 0, 1, 1, 0], 2) == b_trace.lru_loads([0, 0, 1, 1, 0], 2) == 2
    assert b_trace.belady_loads([0, 1, 2, 0], 3) == 3


def test_trace_is_seeded_skewed_and_bursty() -> None:
    a, b = b_trace.make_trace(0, 300), b_trace.make_trace(0, 300)
    assert a == b and len(a) == 300 and b_trace.make_trace(1, 300) != a
    counts = [a.count(i) for i in range(3)]
    assert counts[0] > counts[1] > counts[2] > 0  # Zipf: the first model is the most popular
    switches = sum(1 for x, y in itertools.pairwise(a) if x != y)
    assert switches < 150  # bursts: far fewer switches than an uncorrelated trace (~170)
    for cap in (1, 2):
        assert b_trace.belady_loads(a, cap) <= b_trace.lru_loads(a, cap)


def test_summary_and_percentiles() -> None:
    s = harness.summary([3.0, 1.0, 2.0, 4.0])
    assert s["median"] == 2.5 and s["min"] == 1.0 and s["max"] == 4.0 and s["n"] == 4
    assert harness.percentile([float(x) for x in range(1, 101)], 99) == 99.0
    assert harness.percentile([], 50) is None
    t = harness.target("x", 0.5, 1.0, "<=")
    assert t["met"] and not harness.target("x", None, 1.0, "<=")["met"]
    assert not harness.target("y", 0.5, 0.97, ">=")["met"]


@pytest.mark.slow
def test_smoke_run_writes_results_and_report(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    docs: dict[str, dict[str, Any]] = {}
    for name in NAMES:
        doc = json.loads((out / f"{name}.json").read_text())
        docs[name] = doc
        assert doc["benchmark"] == name and doc["smoke"] is True
        assert "error" not in doc, (name, doc.get("error"))
        assert doc["machine"]["cores"] >= 1 and doc["machine"]["cpu"]
        assert len(doc["loadavg_start"]) == 3 and len(doc["loadavg_end"]) == 3
        assert doc["targets"], name
        for t in doc["targets"]:
            assert set(t) == {"name", "value", "limit", "op", "met"} and t["op"] in ("<=", ">=")
            assert isinstance(t["met"], bool)
    # the comparisons really ran on both sides
    for name, sides in (("warm_call", ("modeld_run", "standalone")),
                        ("cold_load", ("modeld", "inproc")), ("streaming", ("modeld", "inproc"))):
        for side in sides:
            assert len(docs[name]["samples"][side]) == docs[name]["rounds"], (name, side)
            assert all(x > 0 for x in docs[name]["samples"][side])
    assert docs["streaming"]["tokens"]["modeld"]["median"] > 1
    for side in ("modeld_mib_s", "curl_mib_s"):  # pull: both sides fetched the file
        assert docs["pull"][side]["n"] == docs["pull"]["rounds"] and docs["pull"][side]["min"] > 0
    assert docs["prefix_reuse"]["second_reused_tokens"]["median"] > 0
    assert docs["cli_startup"]["help_identical_to_typer"] is True
    conc = docs["concurrency"]
    assert conc["requests"] == conc["expected_requests"] and not conc["errors"]
    assert conc["mismatch_count"] == 0  # every reply equals its one-at-a-time reference
    assert set(conc["variants_per_prompt"].values()) == {1}  # greedy: independent of history
    assert docs["footprint"]["runner_baseline_bytes"] > 0
    assert docs["agent_turns"]["second_cached_tokens"]["median"] > 0
    trace = docs["trace"]
    runs = trace["runs"]
    assert trace["belady_optimum_loads"] <= runs["modeld_cost"]["loads"]
    assert trace["belady_optimum_loads"] <= runs["modeld_lru"]["loads"]
    assert runs["process_per_request"]["loads"] == runs["process_per_request"]["requests"]
    for key in ("modeld_cost", "modeld_lru", "process_per_request"):  # one flag per request
        assert runs[key]["loaded"].count("1") == runs[key]["loads"], key
    assert trace["belady_loaded"].count("1") == trace["belady_optimum_loads"]
    assert len(trace["loads_over_seeds"]) == 2
    for row in trace["loads_over_seeds"]:
        assert row["belady"] <= min(row["modeld_cost"], row["lfu_known_simulated"])
    assert docs["prefix_reuse"]["greedy_second_reused_tokens"]["median"] > 0
    svg = (out / "trace-loads.svg").read_text()
    # one curve per system with load flags; llama_cpp.server only where its extras are installed
    curves = 4 + bool(runs.get("llama_cpp_server", {}).get("loaded"))
    assert svg.startswith("<svg") and svg.count("<polyline") == curves
    report = (out / "benchmarks.md").read_text()
    assert "## Targets" in report and "## Memory estimate calibration" in report
    for title in ("Warm call", "Streaming", "Cold load", "Prefix reuse", "Trace", "Footprint",
                  "CLI start-up", "Concurrency"):
        assert f"## {title}" in report
