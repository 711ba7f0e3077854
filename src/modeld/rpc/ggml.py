"""llama.cpp's RPC backend through llama-cpp-python's own library handle: shared by the runner
(registering workers, reading where a load went) and ``modeld rpc-worker`` (serving).

llama-cpp-python does not pass ``rpc_servers`` any more (a silent no-op since 0.3.7), so the
runner registers its workers itself, before ``Llama(...)``: ``ggml_backend_rpc_add_server`` of
the ``RPC`` backend registry, then ``ggml_backend_register``; llama.cpp then offloads to every
registered device (RPC devices first) when ``n_gpu_layers`` is -1. This must go through
``llama_cpp.llama_cpp._lib`` (libllama, whose ggml is ``libggml.so.0``): the wheel also ships
``libggml.so`` as a separate copy with a registry of its own, and devices registered there are
never seen. Registrations cannot be undone, so a runner that registered workers exits when its
model is unloaded (it never becomes the spare).
"""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Sequence
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp

from modeld.errors import RpcWorkerError
from modeld.rpc import endpoints as rpc

log = logging.getLogger("modeld.runner")

_lib: Any = llama_cpp.llama_cpp._lib
_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t,
    ctypes.POINTER(ctypes.c_void_p),
)  # fmt: skip
_GGML_BACKEND_DEVICE_TYPE_CPU = 0
_declared = False


def _declare() -> None:
    global _declared
    if _declared:
        return
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "ggml_backend_reg_by_name": (ctypes.c_void_p, [ctypes.c_char_p]),
        "ggml_backend_reg_get_proc_address": (ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        "ggml_backend_register": (None, [ctypes.c_void_p]),
        "ggml_backend_dev_count": (ctypes.c_size_t, []),
        "ggml_backend_dev_get": (ctypes.c_void_p, [ctypes.c_size_t]),
        "ggml_backend_dev_name": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_description": (ctypes.c_char_p, [ctypes.c_void_p]),
        "ggml_backend_dev_memory": (
            None,
            [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
        ),
        "ggml_backend_dev_by_name": (ctypes.c_void_p, [ctypes.c_char_p]),
        "ggml_backend_dev_by_type": (ctypes.c_void_p, [ctypes.c_int]),
        "ggml_backend_dev_type": (ctypes.c_int, [ctypes.c_void_p]),
    }  # fmt: skip
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(_lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    _declared = True


def supported() -> bool:
    """Whether this llama-cpp-python was built with ``-DGGML_RPC=ON``."""
    return bool(llama_cpp.llama_supports_rpc())


def require() -> None:
    """Raise RpcWorkerError unless the RPC backend is built in."""
    if not supported():
        raise RpcWorkerError(
            "this llama-cpp-python was built without the RPC backend (-DGGML_RPC=ON)",
            hint="rerun scripts/setup.sh (it builds with RPC), or reinstall llama-cpp-python "
            "with CMAKE_ARGS=\"-DGGML_RPC=ON\"",
            details={"problem": "not_built"},
        )


def _proc(name: bytes) -> int:
    _declare()
    reg = _lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        require()
        raise RpcWorkerError(
            "llama.cpp has no RPC backend registry", details={"problem": "not_built"}
        )
    addr = _lib.ggml_backend_reg_get_proc_address(reg, name)
    if not addr:
        raise RpcWorkerError(f"llama.cpp's RPC backend has no {name.decode()}",
                             hint="use llama-cpp-python 0.3.36 (setup.sh pins it)",
                             details={"problem": "not_built"})
    return int(addr)


def probe_all(endpoints: Sequence[str], timeout_s: float = rpc.PROBE_TIMEOUT_S) -> list[rpc.Hello]:
    """Probe every endpoint (so llama.cpp never aborts on an unreachable one or blocks on a
    busy one): their versions and devices' memory, in order."""
    require()
    hellos = []
    for ep in endpoints:
        hello = rpc.probe(ep, timeout_s)
        log.info("rpc worker %s answers (protocol %s, %d MiB free)", ep, hello.version,
                 hello.free >> 20)  # fmt: skip
        hellos.append(hello)
    return hellos


def register(endpoints: Sequence[str]) -> None:
    """Register each (probed) endpoint as a backend; its devices become ``RPC0``, ``RPC1``,
    ... in this order."""
    require()
    add = _ADD_SERVER(_proc(b"ggml_backend_rpc_add_server"))
    for ep in endpoints:
        reg = add(ep.encode())
        if not reg:
            raise rpc.worker_error(ep, f"llama.cpp could not add rpc worker {ep}",
                                   "see the runner log", "unreachable")
        _lib.ggml_backend_register(reg)


#: ggml_backend_dev_type, in its enum's order
DEVICE_TYPES = ("cpu", "gpu", "igpu", "accel")


def devices(memory: bool = True) -> list[dict[str, Any]]:
    """Every ggml device this process sees: name, description, type and, with ``memory``,
    free and total bytes. The first call initialises every backend (CUDA: cuInit and the
    device properties, no context); asking a CUDA device its memory creates its context
    (hundreds of MiB of VRAM held by this process), so the runner asks without."""
    _declare()
    out: list[dict[str, Any]] = []
    for i in range(int(_lib.ggml_backend_dev_count())):
        dev = _lib.ggml_backend_dev_get(i)
        kind = int(_lib.ggml_backend_dev_type(dev))
        row: dict[str, Any] = {
            "name": (_lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
            "description": (_lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            "type": DEVICE_TYPES[kind] if 0 <= kind < len(DEVICE_TYPES) else str(kind),
        }  # fmt: skip
        if memory:
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            _lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            row["free"], row["total"] = int(free.value), int(total.value)
        out.append(row)
    return out


# "load_tensors:   RPC0[127.0.0.1:50052] model buffer size =    12.34 MiB",
# "llama_kv_cache:        CPU KV buffer size =     8.00 MiB", "... compute buffer size = ..."
_BUFFER = re.compile(
    r"^\s*(?P<dev>\S+?)(?:\[(?P<ep>[^\]]*)\])?\s+(?P<kind>model|KV|compute|output)"
    r" buffer size =\s*(?P<mib>[0-9.]+) MiB"
)
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<of>\d+) layers")


def shares(log_lines: Sequence[str]) -> dict[str, Any]:
    """Per device, the bytes of model weights, KV cache and compute buffers llama.cpp reported
    while loading (its log), and the layers offloaded (``offloaded N/M layers``). An RPC
    buffer is named ``RPC<index on its server>[endpoint]`` (every single-device worker's is
    ``RPC0[...]``), so RPC buffers are keyed by their endpoint, host buffers by name."""
    per: dict[str, dict[str, int]] = {}
    layers: dict[str, int] = {}
    for line in log_lines:
        text = line.split(":", 1)[1] if ":" in line.split("=")[0] else line
        m = _BUFFER.match(text)
        if m:
            dev = m["ep"] or m["dev"].removesuffix("_Mapped")
            kind = {"KV": "kv"}.get(m["kind"], m["kind"])
            row = per.setdefault(dev, {})
            row[kind] = row.get(kind, 0) + int(float(m["mib"]) * 1024 * 1024)
            continue
        o = _OFFLOADED.search(line)
        if o:
            layers = {"offloaded": int(o["n"]), "total": int(o["of"])}
    return {"buffers": per, "layers": layers}


def load_report(load_log: list[str]) -> dict[str, Any]:
    """``devices`` and ``layers_offloaded`` of a ``loaded``: what llama.cpp placed on each
    device (its load log) and each device's memory now."""
    found = shares(load_log)
    per: dict[str, dict[str, int]] = found["buffers"]
    out: list[dict[str, Any]] = []
    seen = set()
    for dev in devices():
        name = str(dev["name"])
        key = str(dev["description"]) if name.startswith("RPC") else name
        row = per.get(key, {})
        if name.startswith("RPC") or row:
            seen.add(key)
            out.append({
                "device": name, "endpoint": dev["description"] if name.startswith("RPC") else None,
                "model_bytes": row.get("model", 0), "kv_bytes": row.get("kv", 0),
                "compute_bytes": row.get("compute", 0), "free_bytes": dev["free"],
                "total_bytes": dev["total"],
            })  # fmt: skip
    for name, row in per.items():  # host buffers (CPU, CPU_REPACK, ...) are not devices
        if name not in seen:
            out.append({
                "device": name, "endpoint": None, "model_bytes": row.get("model", 0),
                "kv_bytes": row.get("kv", 0), "compute_bytes": row.get("compute", 0),
                "free_bytes": None, "total_bytes": None,
            })  # fmt: skip
    layers = found["layers"]
    offloaded = f"{layers['offloaded']}/{layers['total']}" if layers else None
    return {"devices": out, "layers_offloaded": offloaded}


def device(name: str) -> int:
    """The ggml device called ``name`` (``CPU``, ``CUDA0``, ...), or a clear error listing the
    devices this build has (checked before a worker says it is serving)."""
    require()
    _declare()
    if name.upper() == "CPU":
        dev = _lib.ggml_backend_dev_by_type(_GGML_BACKEND_DEVICE_TYPE_CPU)
    else:
        dev = _lib.ggml_backend_dev_by_name(name.encode())
    if not dev:
        names = ", ".join(d["name"] for d in devices() if not d["name"].startswith("RPC"))
        raise RpcWorkerError(f"no ggml device {name!r} in this build",
                             hint=f"devices here: {names}", details={"problem": "device"})
    return int(dev)


def serve(endpoint: str, device_name: str, n_threads: int, cache_dir: str | None) -> None:
    """Serve ``device_name`` (``CPU``, ``CUDA0``, ...) at ``endpoint`` until the process ends
    (blocks inside llama.cpp with the GIL released: run it in a thread)."""
    dev = device(device_name)
    start = _START_SERVER(_proc(b"ggml_backend_rpc_start_server"))
    devs = (ctypes.c_void_p * 1)(dev)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, n_threads, 1, devs)
