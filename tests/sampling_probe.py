"""Run as a subprocess by test_sampling.py: the top-k shortlist against llama.cpp's full chain.

On the real Gemma vocabulary (262,144 tokens), for several settings and seeds: at every step
the full chain (``llama_sampler_sample`` over all logits) and the shortlist
(:meth:`PromptState._shortlisted`), two samplers seeded alike, pick from the same row; the
full chain's token is decoded. Prints one JSON object: per setting, steps, picks equal, and
how often the shortlist was taken (it may decline: too few tokens near the best).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import llama_cpp

from generation_probe import SoloState
from modeld.runner.sampling import make_sampler, shortlist_top_k
from modeld.wire.options import Sampling

SETTINGS = (
    dict(temperature=0.7, seed=1),  # modeld's defaults otherwise: top-k 40, top-p 0.95
    dict(temperature=1.5, top_k=100, top_p=1.0, seed=2),
    dict(temperature=0.9, top_k=8, min_p=0.05, seed=3),
    dict(temperature=1.0, top_k=200, top_p=0.99, seed=4),
    dict(temperature=2.0, top_k=40, seed=5),
)
STEPS = 40


def main(path: str) -> dict[str, Any]:
    llm = llama_cpp.Llama(
        model_path=path, n_ctx=512, n_batch=512, n_ubatch=512, n_threads=2, n_threads_batch=2,
        flash_attn=True, swa_full=False, logits_all=False, verbose=False, seed=1,
    )  # fmt: skip
    state = SoloState(llm, 0)
    prompt = llm.tokenize(b"Write a short story about a lighthouse keeper:", add_bos=True)
    out: dict[str, Any] = {}
    for opts in SETTINGS:
        sampling = Sampling(**opts)  # type: ignore[arg-type]
        k = shortlist_top_k(sampling)
        llm.set_seed(sampling.seed)
        full = make_sampler(llm, sampling)
        short = make_sampler(llm, sampling)
        state.reset()
        state.prepare(prompt, False)
        equal = taken = 0
        for _ in range(STEPS):
            token = state.sample(full, -1)  # top_k 0: llama.cpp fills all candidates
            picked = state._shortlisted(short, state.row, k)
            if picked >= 0:
                taken += 1
                equal += picked == token
            else:  # declined: the runner's fallback, the full chain (one draw, as the first)
                llama_cpp.llama_sampler_sample(short.sampler, llm._ctx.ctx, -1)
            state.decode(token)
        out[json.dumps(opts)] = {"top_k": k, "steps": STEPS, "taken": taken, "equal": equal}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
