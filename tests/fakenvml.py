"""A fake ``pynvml`` for tests without a card: cards and their processes, answered with
pynvml's own ctypes structures and errors (install it with
``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([...]))``)."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real


@dataclass
class FakeCard:
    """One card: its name, total bytes and processes (pid -> bytes; None: NVML names none,
    then ``used`` says what is taken)."""

    name: str
    total: int
    processes: dict[int, int] | None = field(default_factory=dict)
    used: int = 0

    def used_bytes(self) -> int:
        return self.used + sum((self.processes or {}).values())


class FakeNvml(types.ModuleType):
    """The calls modeld.model.probe makes, over :class:`FakeCard` s the test may change between
    calls (a runner that loaded now holds bytes); counts inits and shutdowns."""

    def __init__(self, cards: list[FakeCard]) -> None:
        super().__init__("pynvml")
        self.cards = cards
        self.inits = self.shutdowns = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.cards[h].name.encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        card, mem = self.cards[h], real.c_nvmlMemory_t()
        mem.total, mem.used = card.total, card.used_bytes()
        mem.free = card.total - mem.used
        return mem

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        out = []
        for pid, used in (self.cards[h].processes or {}).items():
            p = real.c_nvmlProcessInfo_t()
            p.pid, p.usedGpuMemory = pid, used
            out.append(p)
        return out

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
