"""Run a real ``redis-server`` on 127.0.0.1 for tests (no persistence, own port, stopped by PID)."""

from __future__ import annotations

import shutil
import tempfile

import redis

from tools.harness.procs import ManagedProcess, free_port


class RedisServer:
    def __init__(self, port: int | None = None, name: str = "redis") -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.exe = exe
        self.port = port or free_port()
        self.name = name
        self.dir = tempfile.mkdtemp(prefix="litellm-kv-redis-")
        self.proc: ManagedProcess | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server (a no-op while it runs: a second process would be orphaned by stop())."""
        if self.proc is not None and self.proc.alive():
            return
        self.proc = ManagedProcess(
            self.name,
            [self.exe, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--protected-mode", "yes"],
        )
        self.proc.wait_until(lambda: bool(redis.Redis(port=self.port).ping()), 20, "redis ping")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)
