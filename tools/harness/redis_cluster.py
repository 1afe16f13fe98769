"""A real Redis Cluster (3 masters + 3 replicas) and a real Sentinel setup (1 master + 1 replica + 3
sentinels) on 127.0.0.1 for tests: free ports, no persistence, bounded waits, every process stopped by PID.

Failover is quick on purpose: ``cluster-node-timeout`` and the sentinels' ``down-after-milliseconds`` are
1 s (production keeps the defaults, 15 s and 30 s), so a test that kills a master sees its replica promoted
in a few seconds.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.cluster import RedisCluster as SyncRedisCluster

from litellm_kv.config import RedisSentinelSettings, RedisSettings
from tools.harness.procs import ManagedProcess, free_ports

FAILOVER_TIMEOUT_MS = 1000


def _exe(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        raise RuntimeError(f"{name} is not installed (apt-get install -y redis-server redis-tools)")
    return exe


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # not up yet
            last = exc
        time.sleep(0.2)
    raise TimeoutError(f"{what} not reached within {timeout:.0f}s (last error: {last})")


@dataclass
class Node:
    """One redis-server of a cluster or of the sentinel setup."""

    name: str
    port: int
    argv: list[str]
    proc: ManagedProcess | None = None

    def start(self) -> None:
        if self.proc is not None and self.proc.alive():
            return
        self.proc = ManagedProcess(self.name, self.argv)
        self.proc.wait_until(lambda: bool(self.client().ping()), 20, f"{self.name} ping")

    def kill(self) -> None:
        """SIGKILL (a crash: no goodbye to the cluster or the sentinels)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.stop()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2, socket_connect_timeout=2)

    def role(self) -> str:
        return str(self.client().info("replication")["role"])


class RedisClusterServers:
    """``masters`` masters with ``replicas`` replicas each, created by ``redis-cli --cluster create``."""

    def __init__(self, masters: int = 3, replicas: int = 1, name: str = "redis-cluster") -> None:
        server, self._cli = _exe("redis-server"), _exe("redis-cli")
        self.dir = Path(tempfile.mkdtemp(prefix="litellm-kv-cluster-"))
        self.nodes: list[Node] = []
        count = masters * (1 + replicas)
        ports = free_ports(2 * count)  # distinct: a repeat would leave a node unable to bind
        for i in range(count):
            port, bus = ports[2 * i], ports[2 * i + 1]
            d = self.dir / str(port)
            d.mkdir()
            argv = [server, "--bind", "127.0.0.1", "--port", str(port), "--cluster-enabled", "yes",
                    "--cluster-port", str(bus), "--cluster-config-file", str(d / "nodes.conf"),
                    "--cluster-node-timeout", str(FAILOVER_TIMEOUT_MS),
                    # A replica always stands for election (its data age is what the test measures).
                    "--cluster-replica-validity-factor", "0", "--repl-ping-replica-period", "1",
                    "--repl-diskless-sync-delay", "0",
                    "--save", "", "--appendonly", "no", "--dir", str(d), "--protected-mode", "yes"]
            self.nodes.append(Node(f"{name}-{i}", port, argv))
        try:
            for n in self.nodes:
                n.start()
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            subprocess.run([self._cli, "--cluster", "create", *addrs, "--cluster-replicas", str(replicas),
                            "--cluster-yes"], check=True, capture_output=True, timeout=60)
            self.wait_healthy(60, masters=masters, replicas=masters * replicas)
        except BaseException:
            self.stop()
            raise

    @property
    def startup_nodes(self) -> list[str]:
        return [f"127.0.0.1:{n.port}" for n in self.nodes]

    def settings(self) -> RedisSettings:
        return RedisSettings(cluster_nodes=self.startup_nodes)

    def client(self) -> SyncRedisCluster:
        live = next(n for n in self.nodes if n.alive())
        return SyncRedisCluster(host="127.0.0.1", port=live.port, socket_timeout=2)

    def _state(self) -> tuple[bool, int, int]:
        """(every live node says cluster_state:ok, masters holding slots, connected replicas)."""
        ok = True
        for n in self.nodes:
            if n.alive():
                ok = ok and "cluster_state:ok" in n.client().execute_command("CLUSTER", "INFO").decode()
        live = next(n for n in self.nodes if n.alive())
        masters = replicas = 0
        for line in live.client().execute_command("CLUSTER", "NODES").decode().splitlines():
            fields = line.split()
            flags = fields[2]
            if "fail" in flags or fields[7] != "connected":
                continue
            if "master" in flags and len(fields) > 8:
                masters += 1
            elif "slave" in flags:
                replicas += 1
        return ok, masters, replicas

    def wait_healthy(self, timeout: float, *, masters: int = 3, replicas: int = 0) -> float:
        """Wait until every live node reports the cluster ok with ``masters`` slot owners and at least
        ``replicas`` replicas, each replica's copy in sync with its master (a master killed before its
        replica's first sync loses its slots' data); returns the seconds waited."""
        t0 = time.monotonic()

        def healthy() -> bool:
            ok, m, r = self._state()
            return ok and m == masters and r >= replicas and (not replicas or self._replicas_in_sync())

        _wait(healthy, timeout, "cluster ok")
        return time.monotonic() - t0

    def _replicas_in_sync(self) -> bool:
        for n in self.nodes:
            if n.alive():
                info = n.client().info("replication")
                if info["role"] == "slave" and info.get("master_link_status") != "up":
                    return False
        return True

    def master_for(self, key: str) -> Node:
        """The node serving ``key``'s slot now."""
        node = self.client().get_node_from_key(key)
        return next(n for n in self.nodes if n.port == int(node.port))

    def flushall(self) -> None:
        self.client().flushall(target_nodes=SyncRedisCluster.PRIMARIES)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


class RedisSentinelServers:
    """One master, one replica and three sentinels monitoring the master as ``master_name``."""

    def __init__(self, master_name: str = "lkv", name: str = "redis-sentinel") -> None:
        server = _exe("redis-server")
        self.master_name = master_name
        self.dir = Path(tempfile.mkdtemp(prefix="litellm-kv-sentinel-"))
        base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "yes",
                "--repl-diskless-sync-delay", "0"]
        # Distinct: a port handed out twice left a sentinel unable to bind, and the set-up never settled.
        mport, rport, *sentinel_ports = free_ports(5)
        self.data = [
            Node(f"{name}-a", mport, [server, "--port", str(mport), "--dir", str(self._mkdir("a")), *base]),
            Node(f"{name}-b", rport, [server, "--port", str(rport), "--dir", str(self._mkdir("b")), *base,
                                      "--replicaof", "127.0.0.1", str(mport)]),
        ]
        self.sentinels: list[Node] = []
        for i, port in enumerate(sentinel_ports):
            d = self._mkdir(f"s{i}")
            conf = d / "sentinel.conf"  # a sentinel rewrites its config file: one each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                f"sentinel monitor {master_name} 127.0.0.1 {mport} 2\n"
                f"sentinel down-after-milliseconds {master_name} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel failover-timeout {master_name} 5000\n"
                f"sentinel parallel-syncs {master_name} 1\n")
            self.sentinels.append(Node(f"{name}-s{i}", port, [server, str(conf), "--sentinel"]))
        try:
            for n in [*self.data, *self.sentinels]:
                n.start()
            _wait(self._settled, 60, "sentinels see the master, its replica and each other")
        except BaseException:
            self.stop()
            raise

    def _mkdir(self, sub: str) -> Path:
        d = self.dir / sub
        d.mkdir()
        return d

    def _settled(self) -> bool:
        for s in self.sentinels:
            info = s.client().sentinel_master(self.master_name)
            if int(info["num-other-sentinels"]) < 2 or int(info["num-slaves"]) < 1:
                return False
        replica = self.replica()
        return replica is not None and replica.client().info("replication").get("master_link_status") == "up"

    def settings(self) -> RedisSettings:
        return RedisSettings(sentinel=RedisSentinelSettings(
            master=self.master_name, nodes=[f"127.0.0.1:{s.port}" for s in self.sentinels]))

    def master_port(self) -> int:
        """The master's port as the sentinels name it now."""
        for s in self.sentinels:
            if s.alive():
                _host, port = s.client().sentinel_get_master_addr_by_name(self.master_name)
                return int(port)
        raise RuntimeError("no sentinel is running")

    def master(self) -> Node:
        port = self.master_port()
        return next(n for n in self.data if n.port == port)

    def replica(self) -> Node | None:
        port = self.master_port()
        return next((n for n in self.data if n.port != port and n.alive()), None)

    def wait_failover(self, old: Node, timeout: float = 30) -> float:
        """Wait until the sentinels name another master than ``old`` and it accepts writes."""
        t0 = time.monotonic()

        def promoted() -> bool:
            m = self.master()
            return m is not old and m.role() == "master"

        _wait(promoted, timeout, "sentinel failover")
        return time.monotonic() - t0

    def wait_replicated(self, timeout: float = 30) -> None:
        """Wait until a replica follows the current master again (after a killed master came back)."""
        _wait(self._settled, timeout, "replica in sync")

    def client(self) -> redis.Redis:
        return self.master().client()

    def flushall(self) -> None:
        self.client().flushall()

    def stop(self) -> None:
        for n in [*self.sentinels, *self.data]:
            n.stop()
