"""Start and stop server processes for tests: free ports, bounded waits, stop by PID only."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / ".artifacts"

T = TypeVar("T")


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports. Each is held until all are chosen: ports picked one by one before any
    server binds them can repeat (the kernel may hand a just-closed port out again)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class ManagedProcess:
    """A child process in its own session, logged to a file, stopped by PID (its group)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        ARTIFACTS.mkdir(exist_ok=True)
        self.log_path = ARTIFACTS / f"{name}-{os.getpid()}-{int(time.time() * 1000)}.log"
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) while waiting for {what}:\n"
                                   f"{self.log_tail()}")
            try:
                if check():
                    return
            except Exception:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"{self.name}: {what} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def wait_http(self, url: str, timeout: float, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        def ok() -> bool:
            return httpx.get(url, timeout=2.0, headers=dict(headers or {})).status_code == status

        self.wait_until(ok, timeout, f"GET {url}")

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


PYTHON = sys.executable


def start_all(starts: Sequence[Callable[[], T]], stop: Callable[[T], None]) -> list[T]:
    """Run every start at once, each in its own thread, and return what they started, in order. If any
    start fails, what the others started is stopped and the first error raised."""
    started: list[T] = []
    error: BaseException | None = None
    with ThreadPoolExecutor(max_workers=max(1, len(starts))) as pool:
        for fut in [pool.submit(start) for start in starts]:
            try:
                started.append(fut.result())
            except BaseException as exc:
                error = error or exc
    if error is not None:
        for item in started:
            with contextlib.suppress(Exception):
                stop(item)
        raise error
    return started


def group_cpu_seconds(pgids: Sequence[int]) -> dict[int, dict[str, float]] | None:
    """CPU seconds (user + system, every thread) used so far by the live processes of each process group in
    ``pgids``, summed per process name (``/proc/<pid>/comm``). A process that has exited no longer counts, so
    take differences over spans in which the servers run on. None where ``/proc`` cannot be read (not Linux)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    tick = os.sysconf("SC_CLK_TCK")
    wanted = set(pgids)
    out: dict[int, dict[str, float]] = {g: {} for g in pgids}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            stat = (proc / entry.name / "stat").read_text()
            comm = (proc / entry.name / "comm").read_text().strip()
        except OSError:  # gone meanwhile
            continue
        # Fields after the name, which is in parentheses and may hold spaces: state, ppid, pgrp, ... utime (14th
        # field of the whole line), stime (15th).
        fields = stat.rsplit(")", 1)[1].split()
        pgrp = int(fields[2])
        if pgrp in wanted:
            per = out[pgrp]
            per[comm] = per.get(comm, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out
