"""Run a command with its stderr on a pseudo-terminal (what a person at a terminal sees) and its
stdout on a pipe (what a script reads), for the tests of progress output."""
from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios


def run_with_tty_stderr(argv: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str, str]:
    """(exit code, stdout, what the terminal on stderr received)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0x0: no room for a bar
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, env=env)
    os.close(slave)
    tty = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                raise TimeoutError(f"{argv}: no output on the terminal for {timeout} s")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end has closed it
                break
            if not data:
                break
            tty += data
        out = proc.stdout.read()
        code = proc.wait(timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    return code, out.decode(), tty.decode(errors="replace")
