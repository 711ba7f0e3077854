"""The GPU benchmark of issue 34, on one NVIDIA card (scripts/gpu-check.sh runs it).

From the recipe of the session that measured an H100 (shared/gpu/measure.py), with modeld's
estimate now its placement's (:func:`modeld.model.placement.with_layers`: the CUDA context
counted). Writes JSON lines to $OUT/gpu.jsonl:
  probe    modeld's own NVML probe (probe.gpu_memory, gpu_process_memory)
  vram     per (n_ctx, n_seq): NVML memory used by a process that loaded the model fully
           offloaded (n_gpu_layers=-1, flash attention, modeld's sequence layout) vs modeld's
           estimate for full offload (sizing.estimate_n(offload=True).vram), plus the bare
           CUDA context of an empty process
  decode   tok/s of llama-cpp-python's own loop (the runner's kind of loop) vs llama-server
  server   llama-server -ngl 99 -fa on: time from start to ready (its cold load), then
           aggregate tok/s of 1, 4 and 8 clients with -np 1/4/8
  modeld   the real daemon (bench/harness.py's, no HTTP) on the same model, every layer on
           the card: the cold load (a `load` on a daemon whose spare runner is ready, and the
           runner's own load seconds), then 1, 4 and 8 clients with parallel 1/4/8 (greedy,
           256 tokens each, through the client library), and its ps row (PROCESSOR, VRAM)
Then ``summary`` (also ``gpu_bench.py summary``, from gpu.jsonl alone) writes $OUT/gpu.json
in bench/results' format with the issue's targets (VRAM estimate within 5% of NVML per
process; one stream >= 0.95x llama-server; 4 and 8 clients >= 1.0x -np 4/8; cold load <=
1.1x): copy it to bench/results/gpu.json and run bench/report.py for docs/benchmarks.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

OUT = os.environ.get("OUT", "/tmp/out")
LOG = os.path.join(OUT, "gpu.jsonl")


def emit(kind: str, **kw: object) -> None:
    kw["kind"] = kind
    line = json.dumps(kw)
    print(line, flush=True)
    with open(LOG, "a") as f:
        f.write(line + "\n")


def nvml_used() -> int:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    pynvml.nvmlShutdown()
    return used


def child(model: str, n_ctx: int, n_seq: int, gen: int) -> None:
    """Load fully offloaded, touch compute with a 512-token batch, report memory, then time
    decode."""
    import llama_cpp

    from modeld.runner import llamaopen
    base = nvml_used()
    t0 = time.time()
    if n_ctx == 0:  # bare CUDA context: the backend initialised, no model
        llama_cpp.llama_backend_init()
        lib = llama_cpp.llama_cpp._lib
        n = lib.ggml_backend_dev_count() if hasattr(lib, "ggml_backend_dev_count") else -1
        emit("bare", devices=n, used_delta=nvml_used() - base)
        return
    with llamaopen._sequences(n_seq):
        llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx * n_seq, n_batch=512, n_ubatch=512,
                              flash_attn=True, swa_full=False, logits_all=False, verbose=False,
                              n_gpu_layers=-1)
    load_s = time.time() - t0
    after_load = nvml_used() - base
    toks = [1] + [7 + (i * 13) % 30000 for i in range(511)]
    llm.eval(toks)
    after_eval = nvml_used() - base
    from modeld.model import probe
    own = probe.gpu_process_memory(os.getpid())
    llm.reset()
    rate = None
    if gen:
        eos = llm.token_eos()
        t1 = time.time()
        out = llm.create_completion("Once upon a time", max_tokens=gen, temperature=0.0,
                                    logit_bias={eos: -1e9} if eos >= 0 else None)
        dt = time.time() - t1
        n = out["usage"]["completion_tokens"]
        rate = n / dt
    emit("vram_measured", n_ctx=n_ctx, n_seq=n_seq, load_s=round(load_s, 2), after_load=after_load,
         after_eval=after_eval, nvml_process=own, decode_tok_s=rate)


def estimate(model: str, n_ctx: int, n_seq: int) -> dict:
    from modeld.model import gguf, placement
    info = gguf.read_model_info(model)
    e = placement.with_layers(info, n_ctx, info.block_count + 1, parallel=n_seq)
    d = e.to_dict()
    return {"vram": d.get("vram"), "total_local": d.get("total"), "kv": d.get("kv_cache"),
            "compute": d.get("compute"), "weights_local": d.get("weights")}


def server_rate(server: str, model: str, np_: int, gen: int) -> dict:
    port = 18088 + np_
    started = time.time()
    with open(os.path.join(OUT, f"server{np_}.log"), "w") as log:
        p = subprocess.Popen([server, "-m", model, "-ngl", "99", "-c", str(4096 * np_),
                              "-np", str(np_), "-fa", "on", "--port", str(port), "-t", "8"],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(3000):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except Exception:
                time.sleep(0.02)
        ready_s = time.time() - started
        body = json.dumps({"prompt": "Once upon a time", "n_predict": gen, "temperature": 0,
                           "ignore_eos": True}).encode()

        def one() -> dict:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/completion", body,
                                         {"Content-Type": "application/json"})
            r = urllib.request.urlopen(req, timeout=120)
            return json.loads(r.read())

        one()  # warm
        import concurrent.futures as cf
        t0 = time.time()
        with cf.ThreadPoolExecutor(np_) as ex:
            res = list(ex.map(lambda _: one(), range(np_)))
        wall = time.time() - t0
        per = [x["timings"]["predicted_per_second"] for x in res]
        total = sum(x["timings"]["predicted_n"] for x in res)
        return {"np": np_, "per_stream_tok_s": per, "aggregate_tok_s": total / wall,
                "ready_s": ready_s}
    finally:
        p.terminate()
        p.wait(10)


def modeld_rates(model: str, gen: int, clients: tuple[int, ...] = (1, 4, 8)) -> None:
    """The real daemon on the card: its cold load, then ``clients`` clients at once on a model
    loaded with that many parallel sequences (each client its own connection)."""
    import concurrent.futures as cf

    from harness import daemon

    with daemon() as d:
        c = d.client(timeout=600)
        t0 = time.time()
        row = c.load(model, n_ctx=4096, parallel=1, gpu_layers=-1)
        emit("modeld_cold_load", wall_s=time.time() - t0, load_seconds=row.get("load_seconds"),
             processor=row.get("processor"), gpu_layers=row.get("gpu_layers"),
             size_vram=row.get("size_vram"), vram_estimate=row.get("vram_estimate"),
             vram_measured=row.get("vram_measured"))
        for n in clients:
            row = c.load(model, n_ctx=4096, parallel=n, gpu_layers=-1)  # reloads for another n

            def one(i: int) -> dict:
                with d.client(timeout=600) as mine:
                    g = mine.generate(model, f"Once upon a time {i}", raw=True, max_tokens=gen,
                                      temperature=0, seed=1)
                    for _ in g:
                        pass
                    assert g.done is not None
                    return dict(g.done)

            one(0)  # warm
            t1 = time.time()
            with cf.ThreadPoolExecutor(n) as ex:
                res = list(ex.map(one, range(n)))
            wall = time.time() - t1
            total = sum(int(x["usage"]["completion_tokens"]) for x in res)
            emit("modeld", clients=n, aggregate_tok_s=total / wall,
                 per_stream_tok_s=[x["timings"].get("tokens_per_s") for x in res],
                 batched_max=max(int(x["timings"].get("batched_max") or 1) for x in res),
                 processor=row.get("processor"), parallel=row.get("parallel"))
        emit("modeld_stats", **{k: v for k, v in c.stats().items() if k in (
            "backend", "devices", "vram_estimate_error_samples", "estimate_error_samples")})


def summary() -> dict:
    """$OUT/gpu.json from gpu.jsonl: the rows and the issue's targets."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from harness import target

    recs: list[dict] = []
    with open(LOG) as f:
        recs = [json.loads(line) for line in f if line.strip()]

    def by(kind: str) -> list[dict]:
        return [r for r in recs if r.get("kind") == kind]

    vram = []
    for m in by("vram_measured"):
        est = next((e for e in by("vram_estimate")
                    if (e["n_ctx"], e["n_seq"]) == (m["n_ctx"], m["n_seq"])), {})
        if est.get("vram") and m.get("nvml_process"):
            vram.append({"n_ctx": m["n_ctx"], "n_seq": m["n_seq"], "nvml": m["nvml_process"],
                         "estimate": est["vram"],
                         "error": (est["vram"] - m["nvml_process"]) / m["nvml_process"]})
    server = {r["np"]: r for r in by("server") if "error" not in r}
    ours = {r["clients"]: r for r in by("modeld")}
    cold = next(iter(by("modeld_cold_load")), {})
    targets = [target(f"VRAM estimate error, n_ctx {v['n_ctx']} x {v['n_seq']}",
                      abs(v["error"]), 0.05, "<=") for v in vram]
    for n in (1, 4, 8):
        if n in server and n in ours:
            ratio = ours[n]["aggregate_tok_s"] / server[n]["aggregate_tok_s"]
            targets.append(target(f"{n} client(s): modeld / llama-server -np {n} (tok/s)",
                                  ratio, 0.95 if n == 1 else 1.0, ">="))
    if cold.get("wall_s") and 1 in server:
        targets.append(target("cold load: modeld load / llama-server start to ready",
                              cold["wall_s"] / server[1]["ready_s"], 1.1, "<="))
    card = by("probe")[0].get("gpus", [{}])[0] if by("probe") else {}
    doc = {"benchmark": "gpu", "title": "On an NVIDIA card (issue 34)",
           "what": "a TinyLlama-1.1B-shaped f16 model (2.2 GB, generated), every layer on the "
           "card; VRAM per process (NVML) vs modeld's estimate; decode of llama-server "
           "-ngl 99 -fa on (-np 1/4/8) vs the modeld daemon (parallel 1/4/8), 256 greedy tokens "
           "per client; cold load", "card": card.get("name"), "vram": vram,
           "server": list(server.values()), "modeld": list(ours.values()), "cold_load": cold,
           "targets": targets}
    with open(os.path.join(OUT, "gpu.json"), "w") as f:
        json.dump(doc, f, indent=2)
    for t in targets:
        print(f"{'MET ' if t['met'] else 'MISS'} {t['name']}: {t['value']:.3f} "
              f"({t['op']} {t['limit']})")
    return doc


def main() -> None:
    mode = sys.argv[1]
    if mode == "child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return
    if mode == "summary":
        summary()
        return
    model, server = sys.argv[2], sys.argv[3]
    from modeld.model import probe
    try:
        emit("probe", gpus=[g.to_dict() for g in probe.gpu_memory()],
             budget=probe.usable_memory().to_dict())
    except Exception as exc:
        emit("probe", error=repr(exc))
    subprocess.run([sys.executable, __file__, "child", model, "0", "1", "0"], timeout=120)
    for n_ctx, n_seq, gen in [(4096, 1, 256), (16384, 1, 0), (4096, 4, 0), (32768, 1, 0)]:
        try:
            emit("vram_estimate", n_ctx=n_ctx, n_seq=n_seq, **estimate(model, n_ctx, n_seq))
        except Exception as exc:
            emit("vram_estimate", n_ctx=n_ctx, n_seq=n_seq, error=repr(exc))
        r = subprocess.run([sys.executable, __file__, "child", model, str(n_ctx), str(n_seq),
                            str(gen)], timeout=180, capture_output=True, text=True)
        if r.returncode:
            emit("child_failed", n_ctx=n_ctx, n_seq=n_seq, rc=r.returncode, err=r.stderr[-1500:])
    if os.path.exists(server):
        for np_ in (1, 4, 8):
            try:
                emit("server", **server_rate(server, model, np_, 256))
            except Exception as exc:
                emit("server", np=np_, error=repr(exc))
    try:
        modeld_rates(model, 256)
    except Exception as exc:
        emit("modeld", error=repr(exc))
    summary()


if __name__ == "__main__":
    main()
