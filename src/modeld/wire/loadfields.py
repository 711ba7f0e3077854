"""The one declaration of a runner's ``load`` message (daemon -> runner): each field of
:class:`LoadSpec` says its check, its default and its doc line, with the machinery of
:mod:`modeld.wire.requestfields`. The daemon's builder (:func:`modeld.wire.runnerwire.load`) and the
runner's parser (:func:`modeld.runner.specs.parse_load`) derive from it. Adding a load field
(a GPU setting, say): a line here, where the daemon decides it (``scheduler._start_load``) and
its use in the runner.

Pure: no native imports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from typing import Any

from modeld.config import PROMPT_CACHE_MIB
from modeld.model.kvcache import KV_CACHE_TYPES
from modeld.wire import requestfields
from modeld.wire.reqparse import MAX_PARALLEL, MODES, rpc_endpoints
from modeld.wire.requestfields import Fail, Fields, declare, flag, ints, nonempty, one_of, text

N_CTX_MAX = 1 << 24


def _path(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if not isinstance(value, str) or not value:
        raise fail(f"{name!r} must be a non-empty string")
    return value


def _n_ctx(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    ints(256, N_CTX_MAX)(value, name, fail, got)
    if value % 256:
        raise fail(f"{name!r} must be a multiple of 256, got {value}")
    return value


def _rpc(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    return rpc_endpoints(value, name, fail, got) or ()  # the client's check (none: empty)


def _split(value: Any, name: str, fail: Fail, got: Mapping[str, Any]) -> Any:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise fail(f"{name!r} must be a list of non-negative numbers")
    return tuple(float(x) for x in value)


@dataclass(frozen=True, kw_only=True)
class LoadSpec:
    """What a runner is asked to load, and how (MISSING: required)."""

    path: str = declare(MISSING, _path, "the model's GGUF file")
    mode: str = declare("generate", one_of(MODES), "generate, embed or rerank", always=True)
    n_ctx: int = declare(MISSING, _n_ctx, "context cells per sequence (a multiple of 256; "
                         "with kv_unified the one pool's, each sequence may use them all)")
    n_threads: int = declare(MISSING, ints(1, 1024), "CPU threads of the load and warm-up")
    n_batch: int = declare(512, ints(1, 1 << 20), "llama.cpp's n_batch", always=True)
    seed: int = declare(0, ints(-(1 << 31), (1 << 32) - 1), "the context's seed", always=True)
    chat_format: str | None = declare(None, text, "the chat format (None: the model's)")
    prompt_cache_mib: int = declare(PROMPT_CACHE_MIB, ints(0, 1 << 20), "bound of the prompt "
                                    "snapshots (generate mode; 0: off)", always=True)
    warm_up: bool = declare(True, flag, "a short evaluation before replying", always=True)
    prompt_cache_dir: str | None = declare(None, nonempty, "where snapshots outlive eviction")
    parallel: int = declare(1, ints(1, MAX_PARALLEL), "sequences decoded together")
    kv_unified: bool = declare(False, flag, "one pool of n_ctx cells shared by the sequences "
                               "(llama-server's --kv-unified)")
    rpc: tuple[str, ...] = declare((), _rpc, "llama.cpp RPC workers to offload every layer to")
    rpc_ctx_floor: int | None = declare(None, ints(256, N_CTX_MAX), "n_ctx may be lowered to "
                                        "this to fit the workers", only_with="rpc")
    rpc_memory: int | None = declare(None, ints(1, 1 << 62), "bytes of each worker's memory to "
                                     "plan with (None: its free memory)", only_with="rpc")
    gpu_layers: int = declare(0, ints(-1, 1 << 16), "layers on the GPUs (-1: all; 0: CPU only, "
                              "no GPU touched)")
    tensor_split: tuple[float, ...] = declare((), _split, "llama.cpp's split weights between "
                                              "the GPUs (empty: by free memory)")
    type_k: str = declare("f16", one_of(KV_CACHE_TYPES), "the KV cache's K type")
    type_v: str = declare("f16", one_of(KV_CACHE_TYPES), "the KV cache's V type")
    handoff: str | None = declare(None, nonempty, "file prefix of the previous runner's "
                                  "sequences (runner/handoff.py)")
    handoff_pid: int | None = declare(None, ints(1, 1 << 31), "that runner's process (its exit "
                                      "ends the wait)", only_with="handoff")
    mmproj: str | None = declare(None, nonempty, "the image projector loaded beside the model")


FIELDS: Fields = dataclasses.fields(LoadSpec)


def write(values: Mapping[str, Any]) -> dict[str, Any]:
    """A ``load`` message's fields for ``values`` (TypeError: one unknown or missing)."""
    return requestfields.write(FIELDS, values, "load")


def parse(msg: Mapping[str, Any], fail: Fail) -> LoadSpec:
    """The runner's reading of a ``load`` message (``fail(text)``: the error to raise)."""
    return LoadSpec(**requestfields.read(FIELDS, msg, fail))
