"""The GPU benchmark (issues 34, 44), on one NVIDIA card; scripts/gpu-check.sh runs it.

    gpu_bench.py main MODEL LLAMA_SERVER [--cpu]     rows to $OUT/gpu.jsonl, then the summary
    gpu_bench.py summary                             $OUT/gpu.json from $OUT/gpu.jsonl alone

Rows (JSON lines, ``kind`` first):
  probe       modeld's own NVML probe (probe.gpu_memory, usable_memory)
  vram_*      per (n_ctx, n_seq): NVML memory used by a process that loaded the model fully
              offloaded (flash attention, modeld's sequence layout) vs modeld's estimate for
              full offload (placement.with_layers: the CUDA context counted); ``bare``: an
              empty process's CUDA context
  server      llama-server -ngl N -fa on: start to ready (its cold load), aggregate tok/s of
              1, 4 and 8 clients at -np 1/4/8; ``server_ttft``: a long prompt's first token;
              ``server`` with ``ngl`` half the layers: the partial offload
  modeld*     the real daemon (bench/harness.py's) on the same model: its cold load, then 1, 4
              and 8 clients at parallel 1/4/8, the long prompt's first token, and the partial
              offload (gpu_layers half the layers), all through the client library
``--cpu`` runs every code path on a CPU build (no NVML rows: the card's numbers are not there;
small contexts, few tokens) so that a test catches drift (tests/test_gpu_check.py). The summary
has the issue's targets: VRAM estimate within 5% of NVML per process; one client >= 0.95x
llama-server, 4 and 8 >= 1.0x; cold load <= 1.1x; first token of a ~3,000-token prompt <=
1.1x; half the layers offloaded >= 0.9x llama-server -ngl the same. Copy gpu.json to
bench/results/gpu.json and run bench/report.py for docs/benchmarks.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gpu_summary

OUT = os.environ.get("OUT", "/tmp/out")
LOG = os.path.join(OUT, "gpu.jsonl")
PROMPTS = os.path.join(OUT, "prompts.json")


@dataclass(frozen=True)
class Plan:
    """What one run measures: the card's sizes, or the CPU check's small ones."""

    cpu: bool
    vram: tuple[tuple[int, int, int], ...]  # (n_ctx, n_seq, tokens to decode)
    clients: tuple[int, ...]
    gen: int  # greedy tokens per client
    prompt_tokens: int  # the long prompt
    n_ctx: int  # each client's context
    child_s: float  # one measuring child's limit


CARD = Plan(
    False,
    ((4096, 1, 256), (16384, 1, 0), (4096, 4, 0), (32768, 1, 0)),
    (1, 4, 8),
    256,
    3000,
    4096,
    180.0,
)
CPU = Plan(
    True, ((512, 1, 16), (1024, 1, 0), (256, 4, 0), (2048, 1, 0)), (1, 4, 8), 16, 300, 512, 120.0
)


def emit(kind: str, **kw: object) -> None:
    line = json.dumps({"kind": kind, **kw})
    print(line, flush=True)
    with open(LOG, "a") as f:
        f.write(line + "\n")


@contextlib.contextmanager
def row(kind: str, **key: object) -> Iterator[dict[str, Any]]:
    """Emit one row of ``kind``: what the block puts in the dict, or the error it raised (the
    run goes on with the next row)."""
    out: dict[str, Any] = dict(key)
    try:
        yield out
    except Exception as exc:  # a row's failure is a result, not the end of the run
        out["error"] = repr(exc)[:2000]
    emit(kind, **out)


def nvml_used(cpu: bool) -> int | None:
    if cpu:
        return None
    import pynvml

    pynvml.nvmlInit()
    used = int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    pynvml.nvmlShutdown()
    return used


def _delta(now: int | None, base: int | None) -> int | None:
    return None if now is None or base is None else now - base


def child(model: str, n_ctx: int, n_seq: int, gen: int, cpu: bool) -> None:
    """Load fully offloaded in modeld's sequence layout, touch compute with a 512-token batch,
    report memory (NVML on a card), then time a greedy decode of ``gen`` tokens."""
    import llama_cpp

    from modeld.runner import llamaopen

    base = nvml_used(cpu)
    t0 = time.time()
    if n_ctx == 0:  # bare CUDA context: the backends initialised, no model
        llama_cpp.llama_backend_init()
        lib = llama_cpp.llama_cpp._lib
        n = lib.ggml_backend_dev_count() if hasattr(lib, "ggml_backend_dev_count") else -1
        emit("bare", devices=n, used_delta=_delta(nvml_used(cpu), base))
        return
    with llamaopen._sequences(n_seq, False):
        llm = llama_cpp.Llama(
            model_path=model,
            n_ctx=n_ctx * n_seq,
            n_batch=512,
            n_ubatch=512,
            flash_attn=True,
            swa_full=False,
            logits_all=False,
            verbose=False,
            n_gpu_layers=-1,
        )
    load_s = time.time() - t0
    after_load = _delta(nvml_used(cpu), base)
    n_eval = min(512, n_ctx) - 1
    llm.eval([1] + [7 + (i * 13) % (llm.n_vocab() - 8) for i in range(n_eval)])
    after_eval = _delta(nvml_used(cpu), base)
    from modeld.model import probe

    own = None if cpu else probe.gpu_process_memory(os.getpid())
    llm.reset()
    rate = None
    if gen:
        eos = llm.token_eos()
        t1 = time.time()
        out: Any = llm.create_completion(
            "Once upon a time",
            max_tokens=gen,
            temperature=0.0,
            logit_bias={eos: -1e9} if eos >= 0 else None,
        )
        rate = out["usage"]["completion_tokens"] / (time.time() - t1)
    emit(
        "vram_measured",
        n_ctx=n_ctx,
        n_seq=n_seq,
        load_s=round(load_s, 2),
        after_load=after_load,
        after_eval=after_eval,
        nvml_process=own,
        decode_tok_s=rate,
    )


def estimate(model: str, n_ctx: int, n_seq: int) -> dict[str, Any]:
    from modeld.model import gguf, placement

    info = gguf.read_model_info(model)
    d = placement.with_layers(info, n_ctx, info.block_count + 1, parallel=n_seq).to_dict()
    return {
        "vram": d.get("vram"),
        "total_local": d.get("total"),
        "kv": d.get("kv_cache"),
        "compute": d.get("compute"),
        "weights_local": d.get("weights"),
    }


def n_layers(model: str) -> int:
    from modeld.model import gguf

    return int(gguf.read_model_info(model).block_count)


def long_prompts(model: str, tokens: int, count: int = 3) -> None:
    """``count`` prompts of about ``tokens`` tokens each, no two alike (no prefix reuse), to
    $OUT/prompts.json; run as a child (``gpu_bench.py prompts``): llama.cpp is not loaded in the
    process that drives the daemon."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    out = []
    for salt in range(count):
        text = " ".join(f"w{salt}x{i % 97}y{i}" if i % 3 else "the" for i in range(tokens))
        toks = llm.tokenize(text.encode(), add_bos=False)[: tokens - 1]
        out.append(llm.detokenize(toks).decode(errors="ignore"))
    with open(PROMPTS, "w") as f:
        json.dump(out, f)


def prompts() -> list[str]:
    with open(PROMPTS) as f:
        return list(json.load(f))


def _post(url: str, body: dict[str, Any], timeout: float = 300) -> dict[str, Any]:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return dict(json.loads(r.read()))


@contextlib.contextmanager
def llama_server(
    server: str, model: str, np_: int, ngl: int, n_ctx: int
) -> Iterator[tuple[str, float]]:
    """A llama-server on loopback; yields its URL and its start-to-ready seconds."""
    port = 18088 + np_ + 10 * (ngl % 97)
    started = time.time()
    with open(os.path.join(OUT, f"server-np{np_}-ngl{ngl}.log"), "w") as log:
        p = subprocess.Popen(
            [
                server,
                "-m",
                model,
                "-ngl",
                str(ngl),
                "-c",
                str(n_ctx * np_),
                "-np",
                str(np_),
                "-fa",
                "on",
                "--port",
                str(port),
                "-t",
                "8",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except Exception:
                if p.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"llama-server did not start (exit {p.poll()})") from None
                time.sleep(0.02)
        yield url, time.time() - started
    finally:
        p.terminate()
        p.wait(10)


def clients_at_once(
    n: int, one: Callable[[int], dict[str, Any]]
) -> tuple[list[dict[str, Any]], float]:
    one(0)  # warm
    t0 = time.time()
    with cf.ThreadPoolExecutor(n) as ex:
        res = list(ex.map(one, range(1, n + 1)))
    return res, time.time() - t0


def server_rows(server: str, model: str, plan: Plan) -> None:
    """llama-server: ready time and tok/s at -np 1/4/8 (every layer), the long prompt's first
    token (-np 1), half the layers (-np 1)."""
    for np_ in plan.clients:
        with (
            row("server", np=np_, ngl=99) as r,
            llama_server(server, model, np_, 99, plan.n_ctx) as (url, ready),
        ):
            res, wall = clients_at_once(np_, lambda i: _complete(url, plan, i))
            r.update(
                ready_s=ready,
                aggregate_tok_s=sum(x["timings"]["predicted_n"] for x in res) / wall,
                per_stream_tok_s=[x["timings"]["predicted_per_second"] for x in res],
            )
            if np_ == 1:
                r["ttft"] = [_ttft_server(url, p) for p in prompts()]
    half = n_layers(model) // 2
    with (
        row("server", np=1, ngl=half) as r,
        llama_server(server, model, 1, half, plan.n_ctx) as (url, ready),
    ):
        res, wall = clients_at_once(1, lambda i: _complete(url, plan, i))
        r.update(
            ready_s=ready, aggregate_tok_s=sum(x["timings"]["predicted_n"] for x in res) / wall
        )


def _complete(url: str, plan: Plan, i: int) -> dict[str, Any]:
    """One client's greedy completion of ``plan.gen`` tokens (no early stop) on llama-server."""
    body = {"prompt": f"Once upon a time {i}", "n_predict": plan.gen, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    return _post(f"{url}/completion", body)


def _ttft_server(url: str, prompt: str) -> dict[str, Any]:
    t0 = time.time()
    x = _post(
        f"{url}/completion",
        {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": False},
    )
    return {"wall_s": time.time() - t0, "prompt_tokens": x["timings"]["prompt_n"]}


def modeld_rows(model: str, plan: Plan) -> None:
    """The real daemon: cold load, 1/4/8 clients, the long prompt's first token, half the layers."""
    from harness import daemon

    with daemon() as d:
        c = d.client(timeout=600)
        with row("modeld_cold_load") as r:
            t0 = time.time()
            got = c.load(model, n_ctx=plan.n_ctx, parallel=1, gpu_layers=-1)
            r.update(
                wall_s=time.time() - t0,
                **{
                    k: got.get(k)
                    for k in (
                        "load_seconds",
                        "processor",
                        "gpu_layers",
                        "size_vram",
                        "vram_estimate",
                        "vram_measured",
                    )
                },
            )
        with row("modeld_ttft") as r:
            r["ttft"] = [_ttft_modeld(d, model, p) for p in prompts()]

        def one(i: int) -> dict[str, Any]:
            with d.client(timeout=600) as mine:
                g = mine.generate(
                    model,
                    f"Once upon a time {i}",
                    raw=True,
                    max_tokens=plan.gen,
                    temperature=0,
                    seed=1,
                )
                for _ in g:
                    pass
                assert g.done is not None
                return dict(g.done)

        for n in plan.clients:
            with row("modeld", clients=n, gpu_layers=-1) as r:
                got = c.load(model, n_ctx=plan.n_ctx, parallel=n, gpu_layers=-1)  # reloads for n
                res, wall = clients_at_once(n, one)
                tokens = sum(int(x["usage"]["completion_tokens"]) for x in res)
                r.update(
                    aggregate_tok_s=tokens / wall,
                    tokens=tokens,
                    per_stream_tok_s=[x["timings"].get("tokens_per_s") for x in res],
                    batched_max=max(int(x["timings"].get("batched_max") or 1) for x in res),
                    processor=got.get("processor"),
                    parallel=got.get("parallel"),
                )
        half = n_layers(model) // 2
        with row("modeld", clients=1, gpu_layers=half) as r:
            got = c.load(model, n_ctx=plan.n_ctx, parallel=1, gpu_layers=half)
            res, wall = clients_at_once(1, one)
            tokens = sum(int(x["usage"]["completion_tokens"]) for x in res)
            r.update(aggregate_tok_s=tokens / wall, tokens=tokens, processor=got.get("processor"))
        emit(
            "modeld_stats",
            **{
                k: v
                for k, v in c.stats().items()
                if k
                in ("backend", "devices", "vram_estimate_error_samples", "estimate_error_samples")
            },
        )


def _ttft_modeld(d: Any, model: str, prompt: str) -> dict[str, Any]:
    with d.client(timeout=600) as mine:
        t0 = time.time()
        g = mine.generate(model, prompt, raw=True, max_tokens=1, temperature=0, seed=1)
        first = None
        for _ in g:
            first = first or time.time() - t0
        assert g.done is not None
        return {
            "wall_s": time.time() - t0,
            "first_s": first,
            "prompt_tokens": g.done["usage"]["prompt_tokens"],
        }


def main(model: str, server: str, plan: Plan) -> None:
    with row("probe", cpu=plan.cpu) as r:
        if not plan.cpu:
            from modeld.model import probe

            r.update(
                gpus=[g.to_dict() for g in probe.gpu_memory()],
                budget=probe.usable_memory().to_dict(),
            )
    me = [sys.executable, os.path.abspath(__file__), "child", model]
    flag = ["--cpu"] if plan.cpu else []
    with row("bare_run"):  # the child emits the "bare" row itself
        subprocess.run([*me, "0", "1", "0", *flag], timeout=plan.child_s, check=True)
    for n_ctx, n_seq, gen in plan.vram:
        with row("vram_estimate", n_ctx=n_ctx, n_seq=n_seq) as r:
            r.update(estimate(model, n_ctx, n_seq))
        try:
            done = subprocess.run(
                [*me, str(n_ctx), str(n_seq), str(gen), *flag],
                timeout=plan.child_s,
                capture_output=True,
                text=True,
            )
            if done.returncode:
                emit(
                    "child_failed",
                    n_ctx=n_ctx,
                    n_seq=n_seq,
                    rc=done.returncode,
                    error=done.stderr[-1500:],
                )
        except subprocess.TimeoutExpired:
            emit(
                "child_failed", n_ctx=n_ctx, n_seq=n_seq, error=f"timed out after {plan.child_s} s"
            )
    with row("prompts", tokens=plan.prompt_tokens):  # without them the first-token rows fail
        subprocess.run([*me[:-2], "prompts", model, str(plan.prompt_tokens)], timeout=plan.child_s,
                       check=True)  # fmt: skip
    if os.path.exists(server):
        server_rows(server, model, plan)
    else:
        emit("server", np=0, ngl=0, error=f"no llama-server at {server!r}: its rows are skipped")
    modeld_rows(model, plan)
    gpu_summary.summary()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--cpu"]
    cpu = "--cpu" in sys.argv[1:]
    if args[0] == "child":
        child(args[1], int(args[2]), int(args[3]), int(args[4]), cpu)
    elif args[0] == "prompts":
        long_prompts(args[1], int(args[2]))
    elif args[0] == "summary":
        gpu_summary.summary()
    else:
        main(args[1], args[2], CPU if cpu else CARD)
