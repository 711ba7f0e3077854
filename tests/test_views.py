"""Text views of ``ps`` and ``stats``: pure formatting of the daemon's JSON data (no daemon)."""

from __future__ import annotations

from typing import Any

from modeld.cli import pstable, views

NOW = 1_800_000_000.0


def row(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "gemma-3-270m-it-q4_k_m",
        "path": "/models/gemma-3-270m-it-q4_k_m.gguf",
        "mode": "generate",
        "state": "ready",
        "n_ctx": 8192,
        "ctx_reason": "config ceiling 8192 (training context 32768)",
        "parallel": 4,
        "parallel_reason": "automatic, as llama-server",
        "measured_bytes": 418 * 2**20,
        "estimate_bytes": 440 * 2**20,
        "in_flight": 0,
        "queued": 0,
        "use_count": 3,
        "last_used": NOW - 75,
        "keep_alive_s": 300.0,
        "keep_alive_left_s": 225.0,
        "forever": False,
        "pinned": False,
        "runner_pid": 4242,
        "load_seconds": 0.71,
        "last_unload_reason": None,
    }
    base.update(over)
    return base


def test_ps_row_cells() -> None:
    (cells,) = pstable.rows([row()], NOW)
    assert cells == (
        "gemma-3-270m-it-q4_k_m",
        "gen",
        "ready",
        "418/440 MiB",
        "8192x4",
        "0/0",
        "3m45s",
        "1m ago",
    )


def test_ps_ctx_cell_shows_parallel_sequences() -> None:
    assert pstable.ctx_cell(2048, 4) == "2048x4"
    assert pstable.ctx_cell(2048, 1) == "2048"
    assert pstable.ctx_cell(None, 4) == "-"
    (cells,) = pstable.rows([row(parallel=None, in_flight=3, queued=5)], NOW)
    assert cells[4:6] == ("8192", "3/5")
    text = pstable.text([row(parallel_reason="the parallel setting")], NOW, verbose=True)
    assert "parallel: the parallel setting" in text


def test_ps_until_column() -> None:
    assert pstable.until(row(pinned=True)) == "pinned"
    assert pstable.until(row(forever=True, keep_alive_left_s=None)) == "forever"
    assert pstable.until(row(in_flight=1, keep_alive_left_s=None)) == "-"
    assert pstable.until(row(keep_alive_left_s=7265.0)) == "2h01m"


def test_ps_mixed_units_and_unknown_memory() -> None:
    assert pstable.mem_pair(900 * 2**20, 1.5 * 2**30) == "900 MiB/1.5 GiB"
    assert pstable.mem_pair(54.2 * 2**20, 5.25 * 2**20) == "54.2/5.2 MiB"
    assert pstable.mem_pair(1000 * 2**20, 2000) == "1.0 GiB/2.0 KiB"
    assert pstable.mem_pair(None, 2**30) == "-/1.0 GiB"


def test_ps_fits_80_columns_with_a_typical_name() -> None:
    rows = [row(), row(mode="embed", state="loading", queued=2, name="nomic-embed-text-v1.5")]
    text = pstable.text(rows, NOW, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert len(lines) == 4  # header, rule, two rows: nothing folded
    assert "ctx_reason" not in text and "config ceiling" not in text


def test_ps_folds_only_the_name_when_narrow() -> None:
    long_name = "a-very-long-model-name-that-goes-on-and-on-q8_0"
    text = pstable.text([row(name=long_name)], NOW, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "".join(line.split()[0] for line in lines[2:]) == long_name
    assert "418/440 MiB" in lines[2]  # value cells stay whole on the first line


def test_ps_verbose_lists_the_reason_under_the_table() -> None:
    text = pstable.text([row()], NOW, width=80, verbose=True)
    assert "  context: config ceiling 8192 (training context 32768)" in text
    assert "  runner pid: 4242" in text


def test_ps_empty() -> None:
    assert pstable.text([], NOW) == "no models loaded\n"


def test_stats_nested_values_read_as_text() -> None:
    assert views._stat_value("evictions", {"memory": 1, "slots": 0, "keep_alive": 2}) == (
        "memory 1, keep_alive 2"
    )
    assert views._stat_value("evictions", {"memory": 0}) == "none"
    assert views._stat_value("cooling_down", []) == "none"
    cooling = [{"name": "bad", "path": "/m/bad.gguf", "reason": "crash", "retry_in_s": 12.0}]
    assert views._stat_value("cooling_down", cooling) == "bad (reason crash, retry in 12.00s)"
    assert views._stat_value("hit_rate", 0.5) == "50%"
    assert views._stat_value("used_bytes", 3 * 2**20) == "3.0 MiB"
    assert views._stat_value("memory_cap_bytes", None) == "-"


def test_stats_view_replaces_samples_by_a_mean() -> None:
    data = {
        "schema_version": 1,
        "kind": "stats",
        "estimate_error_samples": [0.1, -0.05, 0.04],
        "estimate_error_mean": 0.03,
        "estimate_abs_error_mean": 0.0633,
        "uptime_s": 65.0,
    }
    (table,) = views.stats_view(data)
    # cells are rich Text (names are shown escaped, never as markup: cli/visible.py)
    cells = [tuple(str(c) for c in row)
             for row in zip(*(col._cells for col in table.columns), strict=True)]
    assert ("estimate error mean", "+3.0% (3 loads)") in cells
    assert ("estimate abs error mean", "6.3%") in cells
    assert ("uptime", "65.00s") in cells
    assert not any("samples" in label for label, _ in cells)


def test_ps_shows_processor_and_vram_when_a_model_is_on_a_gpu() -> None:
    cpu = pstable.text([row()], NOW, width=80)
    assert "PROCESSOR" not in cpu and "on GPU" not in cpu  # all on the CPU: nothing to say
    gpu = row(name="tiny", processor="100% GPU", gpu_layers=23, n_layers=23,
              size_vram=3000 * 2**20, vram_measured=2900 * 2**20, vram_estimate=3100 * 2**20,
              layers={"CUDA0": "0-22"}, gpu_reason="every layer fits the free VRAM")
    part = row(name="big", processor="35%/65% CPU/GPU", gpu_layers=15, n_layers=23,
               vram_measured=None, vram_estimate=5 * 2**30, layers={"RAM": "0-7",
                                                                     "CUDA0": "8-22"})
    text = pstable.text([gpu, part, row(name="small", processor="100% CPU")], NOW, width=120)
    header, _, *cells = text.splitlines()
    assert header.split()[:6] == ["MODEL", "MODE", "STATE", "MEM", "meas/est", "PROCESSOR"]
    assert "100% GPU" in cells[0] and "35%/65% CPU/GPU" in cells[1] and "100% CPU" in cells[2]
    assert ("tiny on GPU: VRAM 2.8/3.0 GiB meas/est, 23/23 layers (CUDA0 0-22) (every layer "
            "fits the free VRAM)") in text
    assert "big on GPU: VRAM -/5.0 GiB meas/est, 15/23 layers (RAM 0-7, CUDA0 8-22)" in text
    assert "small on GPU" not in text


def _text(renderables: list[Any]) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    for r in renderables:
        console.print(r)
    return " ".join(console.export_text().split())  # single spaces: no column widths


def test_stats_and_show_name_the_backend_devices_and_vram_accuracy() -> None:
    GiB = 2**30
    card = {"name": "CUDA0", "description": "NVIDIA H100 80GB HBM3", "type": "gpu",
            "total_bytes": 80 * GiB, "free_bytes": 60 * GiB, "budget_bytes": 79 * GiB,
            "used_bytes": 3 * GiB, "estimate_bytes": 3 * GiB}
    stats = _text(views.stats_view({
        "backend": "CUDA", "devices": [{"name": "CPU", "type": "cpu"}, card],
        "vram_estimate_error_mean": 0.04, "vram_estimate_error_samples": [0.03, 0.05],
        "vram_estimate_abs_error_mean": 0.04, "vram_used_bytes": [3 * GiB]}))
    assert "vram estimate error mean +4.0% (2 loads)" in stats
    assert "CUDA: CPU; CUDA0 NVIDIA H100 80GB HBM3 (80.0 GiB, 60.0 GiB free" in stats
    assert "vram used 3.0 GiB" in stats
    show = _text(views.show_view({
        "name": "big", "info": {}, "fits": True, "n_ctx": 4096, "plan": "evict",
        "plan_reason": "evicting 1 idle model(s) to free 2.9 GiB of VRAM for big",
        "placement": {"backend": "CUDA", "kv_cache_type": "q8_0", "processor":
                      "35%/65% CPU/GPU", "reason": "15 of 23 layers fit", "layers":
                      {"RAM": "0-7", "CUDA0": "8-22"}, "vram_bytes": [5 * GiB]},
        "evicts": [{"name": "tiny", "reason": "vram", "ram_bytes": 300 * 2**20,
                    "vram_bytes": [3 * GiB]}],
        "backend": "CUDA", "devices": [card]}))
    for line in ("backend CUDA", "KV cache type q8_0",
                 "processor 35%/65% CPU/GPU (15 of 23 layers fit)",
                 "layers RAM 0-7, CUDA0 8-22", "VRAM on CUDA0 5.0 GiB",
                 "would evict tiny (vram: frees 3.0 GiB of VRAM, 300.0 MiB of RAM)",
                 "daemon backend CUDA: CUDA0 NVIDIA H100 80GB HBM3"):
        assert line in show, show
