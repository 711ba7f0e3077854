"""Prompt-lookup speculation (issue 46): modeld with drafts against modeld without, same daemon.

One daemon (``--parallel 4``, the default model), each workload sent with ``draft_max`` 0 and
6 alternately (A B, then B A), greedy and sampled (temperature 0.7, a fixed seed):

- ``code_edit``: a 150-line Python file in the prompt, then its first lines again with one
  function renamed: the reply copies the rest (raw completion: the default model is a base
  model, so the "instruction" is the file's own comment);
- ``json_transform``: a 50-record JSON list, then the same list with a field added, through a
  JSON schema (``format``): structured output with drafts cut by the grammar;
- ``prose``: a story prompt with nothing to copy (the target: no slower);
- ``mixed_4``: 4 clients at once, two code edits and two prose prompts (aggregate tokens/s).

Tokens/s is the reply's ``completion_tokens / generation_s`` (the daemon's timings; for
``mixed_4`` completion tokens over the wall time of the four). Every pair of replies is
compared (``differ``: drafts on vs off; greedy replies must be equal; seeded sampled ones may
differ where a near-tie falls the other way past 512 cells: runner/speculate.py).
llama-server's n-gram speculation is not run here (bench/peer.py builds it; the next
comparison to add).

    .venv/bin/python bench/spec_speed.py [--rounds 3] [--tokens 160] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from harness import RESULTS, daemon, default_model, loadavg, machine, target

SAMPLED = {"temperature": 0.7, "seed": 5, "top_k": 40, "top_p": 0.95}


def code_file() -> str:
    """150 lines of plain Python: small functions over an order record."""
    out = ["import math", "", ""]
    for i in range(19):
        out += [f"def compute_total_{i}(order, rate={i + 1}):",
                f"    \"\"\"Line {i}: the total of an order at rate {i + 1}.\"\"\"",
                "    subtotal = sum(item['price'] * item['qty'] for item in order)",
                f"    tax = math.ceil(subtotal * rate) / {100 + i}",
                "    return subtotal + tax", "", ""]  # fmt: skip
    return "\n".join(out[:150])


def code_prompt() -> str:
    text = code_file()
    return (f"# orders.py\n{text}\n\n# orders.py again, with compute_total_0 renamed to "
            "order_total (nothing else changed):\nimport math\n\n\n"
            "def order_total(order, rate=1):\n")


def json_prompt() -> tuple[str, dict[str, Any]]:
    records = [{"id": i, "name": f"item-{i}", "price": round(1.5 * i + 0.25, 2)} for i in range(50)]
    prompt = (f"records = {json.dumps(records)}\n\n# The same records with \"in_stock\": true "
              f"added to each:\n")
    schema = {"type": "array", "items": {"type": "object", "properties": {
        "id": {"type": "integer"}, "name": {"type": "string"}, "price": {"type": "number"},
        "in_stock": {"type": "boolean"}}, "required": ["id", "name", "price", "in_stock"]}}
    return prompt, schema


PROSE = ("Write a short story about a lighthouse keeper who finds a message in a bottle on a "
         "stormy night. Story:")


def one(client: Any, model: str, prompt: str, draft: int, tokens: int, sampling: dict[str, Any],
        fmt: Any = None) -> dict[str, Any]:
    gen = client.generate(model, prompt, raw=True, max_tokens=tokens, format=fmt,
                          draft_max=draft, **sampling)
    text = gen.text()
    assert gen.done is not None
    t = gen.done["timings"]
    return {"text": text, "tokens": t["completion_tokens"], "generation_s": t["generation_s"],
            "tps": t["tokens_per_s"], "drafted": t["draft_tokens"], "accepted": t["draft_accepted"]}


def mixed(d: Any, model: str, draft: int, tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
    prompts = [code_prompt(), PROSE, code_prompt().replace("order_total", "total"), PROSE + " It"]
    got: dict[int, dict[str, Any]] = {}

    def client(i: int) -> None:
        with d.client() as c:
            got[i] = one(c, model, prompts[i], draft, tokens, sampling)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    total = sum(r["tokens"] for r in got.values())
    return {"text": "\x00".join(got[i]["text"] for i in range(4)), "tokens": total,
            "generation_s": wall, "tps": total / wall,
            "drafted": sum(r["drafted"] for r in got.values()),
            "accepted": sum(r["accepted"] for r in got.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--out", type=Path, default=RESULTS / "speculation.json")
    args = ap.parse_args()
    model = str(default_model())
    jp, schema = json_prompt()
    workloads = {
        "code_edit": lambda c, dr, s: one(c, model, code_prompt(), dr, args.tokens, s),
        "json_transform": lambda c, dr, s: one(c, model, jp, dr, args.tokens, s, schema),
        "prose": lambda c, dr, s: one(c, model, PROSE, dr, args.tokens, s),
    }
    rows: list[dict[str, Any]] = []
    load0, started = loadavg(), time.monotonic()
    with daemon("--parallel", "4") as d, d.client() as c:
        one(c, model, PROSE, 0, 8, {"temperature": 0.0})  # load and warm up
        for kind, sampling in (("greedy", {"temperature": 0.0}), ("sampled", SAMPLED)):
            for name in (*workloads, "mixed_4"):
                runs: dict[int, list[dict[str, Any]]] = {0: [], 6: []}
                for r in range(args.rounds):
                    for draft in ((0, 6) if r % 2 == 0 else (6, 0)):
                        if name == "mixed_4":
                            runs[draft].append(mixed(d, model, draft, args.tokens, sampling))
                        else:
                            runs[draft].append(workloads[name](c, draft, sampling))
                off = statistics.median(x["tps"] for x in runs[0])
                on = statistics.median(x["tps"] for x in runs[6])
                drafted = sum(x["drafted"] for x in runs[6])
                row = {"workload": name, "sampling": kind, "rounds": args.rounds,
                       "tps_off": round(off, 2), "tps_on": round(on, 2),
                       "speedup": round(on / off, 3) if off else None,
                       "drafted": drafted, "accepted": sum(x["accepted"] for x in runs[6]),
                       "acceptance": round(sum(x["accepted"] for x in runs[6]) / drafted, 3)
                       if drafted else None,
                       "tokens": [x["tokens"] for x in runs[6]],
                       "differ": sum(a["text"] != b["text"] for a, b in zip(runs[0], runs[6],
                                                                             strict=True))}
                rows.append(row)
                print(json.dumps(row), flush=True)
    by = {(r["workload"], r["sampling"]): r for r in rows}
    doc = {"benchmark": "speculation", "title": "Prompt-lookup speculation (issue 46)",
           "what": "modeld with drafts (draft_max 6) against modeld without (0), same daemon "
                   "(--parallel 4, default model), interleaved; tokens/s of the reply "
                   "(bench/spec_speed.py).",
           "machine": machine(), "rounds": args.rounds, "loadavg_start": load0,
           "loadavg_end": loadavg(), "duration_s": round(time.monotonic() - started, 1),
           "max_tokens": args.tokens, "results": rows,
           "targets": [target(f"{w} greedy, x drafts off", by[(w, "greedy")]["speedup"], limit,
                              ">=")
                       for w, limit in (("code_edit", 1.5), ("json_transform", 1.5),
                                        ("prose", 0.97))]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
