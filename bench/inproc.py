"""The in-process baselines: plain llama-cpp-python, no modeld, in a child process.

Two uses:

* ``python bench/inproc.py serve`` - a worker that keeps a ``Llama`` and answers JSON-line
  commands on stdin/stdout (``load``, ``stream``, ``close``), so the benchmark can interleave
  it with modeld while both stay warm. Timings are taken inside this process, so they contain
  only llama-cpp-python's own work.
* ``python bench/inproc.py once PATH N_CTX THREADS MAX_TOKENS [PROMPT]`` - what a user's
  standalone script does: import llama_cpp, load, generate, exit (timed from outside).

Load parameters match modeld's runner: n_ctx a multiple of 256, flash_attn=True,
swa_full=False, the same threads, n_batch/n_ubatch, seed 0 and the same warm-up.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any


def _load(path: str, n_ctx: int, threads: int, parallel: int = 0) -> Any:
    """``Llama(...)`` as the runner calls it. With ``parallel`` (the sequences a modeld runner
    loaded the model with), the same context shape: ``parallel`` KV streams of ``n_ctx``
    cells (and, for more than one, no repacked weights), through the runner's own call
    (runner/llamaopen.py) so the two cannot drift apart; without, one sequence of ``n_ctx``
    cells."""
    import llama_cpp

    n_batch = min(512, n_ctx)
    if parallel:
        from modeld.runner import llamaopen, specs

        spec = specs.LoadSpec(path=path, mode="generate", n_ctx=n_ctx, n_threads=threads,
                              n_batch=n_batch, seed=0, chat_format=None, parallel=parallel)
        return llamaopen.open_llama(spec, n_batch)
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        swa_full=False,
        seed=0,
        verbose=False,
    )


def _warm_up(llm: Any) -> None:
    """modeld.runner.Runner.warm_up: evaluate a few tokens, then reset."""
    tokens = llm.tokenize(b"Hello", add_bos=True, special=False)
    llm.eval(tokens[:8])
    llm.reset()


def _stream(llm: Any, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Stream a completion with modeld's sampling settings; time first and last token."""
    t0 = time.perf_counter()
    first = last = None
    n = 0
    text = []
    llm.reset()
    for part in llm.create_completion(
        prompt, max_tokens=max_tokens, temperature=0.0, top_k=40, top_p=0.95, min_p=0.0,
        repeat_penalty=1.0, seed=0, stream=True,
    ):
        now = time.perf_counter()
        first = now if first is None else first
        last = now
        n += 1
        text.append(part["choices"][0]["text"])
    end = time.perf_counter()
    return {"chunks": n, "t_first": (first or end) - t0, "t_last": (last or end) - t0,
            "total_s": end - t0, "text": "".join(text)}


def serve() -> int:
    llm: Any = None
    import llama_cpp  # noqa: F401  (paid once, before the first timed command)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        kind = cmd["cmd"]
        out: dict[str, Any] = {}
        if kind == "load":
            if llm is not None:
                llm.close()
                llm = None
            t0 = time.perf_counter()
            llm = _load(cmd["path"], int(cmd["n_ctx"]), int(cmd["threads"]),
                        int(cmd.get("parallel", 0)))
            t1 = time.perf_counter()
            _warm_up(llm)
            t2 = time.perf_counter()
            out = {"load_s": t1 - t0, "warmup_s": t2 - t1, "total_s": t2 - t0}
        elif kind == "unload":
            if llm is not None:
                llm.close()
                llm = None
        elif kind == "stream":
            out = _stream(llm, cmd["prompt"], int(cmd["max_tokens"]))
        elif kind == "close":
            print(json.dumps({"bye": True}), flush=True)
            return 0
        print(json.dumps(out), flush=True)
    return 0


def once(path: str, n_ctx: int, threads: int, max_tokens: int, prompt: str) -> int:
    llm = _load(path, n_ctx, threads)
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, seed=0)
    sys.stdout.write(out["choices"][0]["text"])
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        sys.exit(serve())
    a = sys.argv[2:]
    sys.exit(once(a[0], int(a[1]), int(a[2]), int(a[3]), a[4] if len(a) > 4 else "Hello"))
