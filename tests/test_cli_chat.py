"""The interactive chat (``modeld run MODEL`` on a terminal), driven through a pseudo-terminal.

The console script's stdin, stdout and stderr are the slave side of a pty, so it sees a real
terminal (the chat opens, the spinner and prompt appear) and we type into the master side.
One ``modeld serve`` per module; the chat uses the tiny ChatML model, greedy and seeded.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest

from cliutil import GREEDY, MODELD, CliEnv, until

PROMPT = ">>> "
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}  # read(2), as /proc/PID/syscall reports it
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


@pytest.fixture(scope="module")
def cli() -> Iterator[CliEnv]:
    with CliEnv.served() as env:
        yield env


def _take_terminal() -> None:
    """In the child, after setsid: make the pty its controlling terminal (Ctrl-C -> SIGINT)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``modeld ARGS`` on a fresh 80x24 pty; ``expect`` reads until a pattern shows up."""

    def __init__(self, cli: CliEnv, *args: str) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.master = master
        self.proc = subprocess.Popen(
            [MODELD, *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=cli.env,
            cwd=cli.root,
            start_new_session=True,
            preexec_fn=_take_terminal,
            close_fds=True,
        )
        os.close(slave)
        self.seen = b""  # everything read so far, ANSI sequences removed
        self.pos = 0  # where the next expect starts looking

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 4096)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.seen += ANSI.sub(b"", data)
        return bool(data)

    def expect(self, pattern: bytes, timeout: float = 60.0) -> re.Match[bytes]:
        rx = re.compile(pattern)
        waited = 0.0
        while True:
            match = rx.search(self.seen, self.pos)
            if match:
                self.pos = match.end()
                return match
            if not self._read(0.2):
                waited += 0.2
                if waited > timeout or (self.proc.poll() is not None and not self._read(0)):
                    raise AssertionError(f"{pattern!r} not seen; output so far:\n{self.text()}")

    def wait_reading(self) -> None:
        """Wait until the CLI's main thread is blocked reading its terminal.

        A SIGINT that lands after ``input()`` printed its prompt but before it entered
        ``read()`` is only acted on after the next line is typed (CPython's readline without the
        readline module); a person cannot hit that window, a test can.
        """
        nr = READ_SYSCALL.get(os.uname().machine)
        if nr is None:
            return

        def reading() -> bool:
            try:
                fields = Path(f"/proc/{self.proc.pid}/syscall").read_text().split()
            except OSError:
                return True  # cannot tell; go ahead
            return fields[:2] == [str(nr), "0x0"]

        until(reading, timeout=30, what="the chat to wait for input")

    def send(self, data: bytes) -> None:
        os.write(self.master, data)

    def wait(self, timeout: float = 30.0) -> int:
        while self._read(0.1):  # drain, so the child never blocks on a full terminal
            pass
        code = self.proc.wait(timeout)
        while self._read(0):
            pass
        return code

    def text(self) -> str:
        return self.seen.decode(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        os.close(self.master)


@pytest.fixture
def terminal(cli: CliEnv) -> Iterator[list[Terminal]]:
    opened: list[Terminal] = []
    yield opened
    for t in opened:
        t.close()


def open_chat(
    cli: CliEnv, terminal: list[Terminal], model: Path, *extra: str, max_tokens: int = 8
) -> Terminal:
    t = Terminal(cli, "run", str(model), "--max-tokens", str(max_tokens), *GREEDY, *extra)
    terminal.append(t)
    t.expect(rb"chat started")
    t.expect(re.escape(PROMPT.encode()))
    return t


def test_chat_two_turns_keep_the_conversation_then_bye(
    cli: CliEnv, terminal: list[Terminal], tiny_chat_model: Path
) -> None:
    t = open_chat(cli, terminal, tiny_chat_model, "--verbose")
    usage = rb"prompt_tokens=(\d+) .*?completion_tokens=(\d+)"
    t.send(b"hello there\n")
    first = t.expect(usage)
    t.expect(re.escape(PROMPT.encode()))
    t.send(b"hello there\n")  # the same words again: only the kept history makes it longer
    second = t.expect(usage)
    t.expect(re.escape(PROMPT.encode()))
    p1, c1 = int(first.group(1)), int(first.group(2))
    p2 = int(second.group(1))
    assert c1 > 0
    # turn 2 = turn 1's prompt + the reply + the same user turn again
    assert p2 > p1 + p1 // 2, (p1, p2, t.text())
    t.send(b"/bye\n")
    assert t.wait() == 0, t.text()
    assert "Traceback" not in t.text()
    # the daemon saw the two chat requests on this model
    row = cli.ps_row(tiny_chat_model)
    assert row is not None and row["use_count"] >= 2 and row["in_flight"] == 0


def test_chat_ctrl_d_exits_0(cli: CliEnv, terminal: list[Terminal], tiny_chat_model: Path) -> None:
    t = open_chat(cli, terminal, tiny_chat_model)
    t.send(b"\x04")  # Ctrl-D at an empty prompt: end of input
    assert t.wait() == 0, t.text()
    assert "Traceback" not in t.text()


def test_chat_ctrl_c_at_prompt_does_not_exit(
    cli: CliEnv, terminal: list[Terminal], tiny_chat_model: Path
) -> None:
    t = open_chat(cli, terminal, tiny_chat_model)
    t.wait_reading()
    t.send(b"\x03")  # Ctrl-C at the prompt: a hint, and the chat goes on
    t.expect(rb"Ctrl-D or /bye")
    t.expect(re.escape(PROMPT.encode()))
    t.send(b"hi\n")
    t.expect(re.escape(PROMPT.encode()))
    t.send(b"/exit\n")
    assert t.wait() == 0, t.text()


def test_chat_ctrl_c_stops_a_reply_and_the_chat_goes_on(
    cli: CliEnv, terminal: list[Terminal], tiny_chat_model: Path
) -> None:
    before = cli.json("stats")["tokens_generated"]
    t = open_chat(cli, terminal, tiny_chat_model, max_tokens=2000)
    t.send(b"tell me everything\n")
    t.expect(rb"tell me everything\n")  # the terminal's echo of our line
    t.expect(rb"[^\s]{3}")  # some of the reply
    t.send(b"\x03")
    t.expect(re.escape(PROMPT.encode()), timeout=30)

    def idle() -> bool:
        row = cli.ps_row(tiny_chat_model)
        return bool(row and row["in_flight"] == 0 and row["state"] == "ready")

    until(idle, timeout=30, what="the chat model idle after Ctrl-C")
    assert cli.json("stats")["tokens_generated"] - before < 2000  # the reply was cut short
    t.send(b"/quit\n")
    assert t.wait() == 0, t.text()
    assert "Traceback" not in t.text()
