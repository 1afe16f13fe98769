"""Which server a URL reaches, however its host is written.

One server answers under many spellings of its address: ``localhost``, ``LOCALHOST``, ``localhost.``,
``127.0.0.1``, ``127.1``, ``2130706433``, ``0x7f.0.0.1``, ``[::ffff:127.0.0.1]``, ``0.0.0.0``, the machine's
own interface addresses, and any DNS name that resolves to one of them. Comparing URLs as written lets a
client reach a governed engine under a spelling nobody listed; comparing :class:`Server` values does not.

* :func:`server` reads a URL without any I/O: host names lower-cased and without their trailing dot, every
  IPv4 form the C library accepts, IPv4-mapped IPv6, and every address of this machine (loopback, the
  unspecified address, which connects to this machine, and each address a socket can bind here) as
  :data:`THIS_HOST`.
* :class:`Resolver` also follows DNS names to their addresses, within a deadline, cached, with a bound on
  lookups in flight. A name that cannot be resolved in time raises :class:`UnresolvedHost`: a caller that
  guards a limit refuses rather than guesses.

What no spelling can show: a server reached through another proxy, a DNS answer that changes between this
check and the connection (rebinding), or an address DNS does not give for the host (a pod's own address
behind a Service's).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

#: The host of every address of this machine: a server bound to all addresses answers on each of them.
THIS_HOST = "this-host"

_IPV4_FORM = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Server:
    """Where a connection goes: ``host`` is an address's text, :data:`THIS_HOST`, or a DNS name (lower case,
    no trailing dot; ``named``); ``port`` is the URL's, or its scheme's default."""

    host: str
    port: int
    named: bool = False

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def literal_address(host: str) -> IPAddress | None:
    """``host`` as an address when it is one in any form a connection accepts, IPv4-mapped IPv6 as IPv4."""
    try:
        ip: IPAddress = ipaddress.ip_address(host)
    except ValueError:
        if not _IPV4_FORM.fullmatch(host):
            return None
        try:  # 127.1, 2130706433, 0x7f.0.0.1: what inet_aton (and so getaddrinfo) reads as IPv4
            ip = ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _binds(ip: IPAddress) -> bool:
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((str(ip), 0))
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=2)
def _binding_tells(version: int) -> bool:
    """Whether a bind succeeding means the address is this machine's: not where any address binds
    (``net.ipv4.ip_nonlocal_bind``), which a documentation address that no machine holds shows."""
    return not _binds(ipaddress.ip_address("192.0.2.1" if version == 4 else "2001:db8::1"))


@functools.lru_cache(maxsize=1024)
def is_this_host(ip: IPAddress) -> bool:
    """Whether a connection to ``ip`` reaches this machine: loopback, unspecified, or an address a socket can
    bind here (one of its interfaces'; only loopback and unspecified where the system binds any address)."""
    if ip.is_loopback or ip.is_unspecified:
        return True
    return _binding_tells(ip.version) and _binds(ip)


def _canonical(ip: IPAddress, port: int) -> Server:
    return Server(THIS_HOST if is_this_host(ip) else ip.compressed, port)


def server(url: str) -> Server | None:
    """The server ``url`` connects to, without looking anything up (a DNS name stays a name, ``localhost``
    is this machine); ``None`` when the URL has no host or a port that is no number."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").rstrip(".")
    if not host:
        return None
    if port is None:
        port = 443 if parts.scheme.lower() in ("https", "wss") else 80
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always this machine's loopback
        return Server(THIS_HOST, port)
    ip = literal_address(host.split("%", 1)[0] if ":" in host else host)
    if ip is not None:
        return _canonical(ip, port)
    return Server(host, port, named=True)


def _settle(done: asyncio.Future[list[Any]], infos: list[Any] | None, error: Exception | None) -> None:
    if done.done():  # given up at the deadline
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(infos or [])


def same_server(a: str, b: str) -> bool:
    """Whether URLs ``a`` and ``b`` connect to one server by :func:`server` (no I/O: ``localhost`` and ``127.0.0.1``
    are one, DNS names as written); URLs it cannot read are compared as written."""
    first, second = server(a), server(b)
    if first is None or second is None:
        return a.strip().rstrip("/") == b.strip().rstrip("/")
    return first == second


def _with_addresses(named: Server, addresses: frozenset[str]) -> frozenset[Server]:
    found = {named}
    for text in addresses:
        ip = literal_address(text)
        if ip is not None:
            found.add(_canonical(ip, named.port))
    return frozenset(found)


class UnresolvedHost(Exception):
    """A DNS name could not be resolved within the deadline (or the resolver failed), so which server it
    reaches is unknown."""


class Resolver:
    """:func:`server`, with DNS names followed to every address they resolve to.

    Answers are kept ``ttl_s`` (a failure ``failure_ttl_s``) for at most ``max_entries`` names. Each lookup
    runs on a daemon thread of its own, one per name at a time and at most ``max_lookups`` at once; while that
    many are running (a lookup given up after ``timeout_s`` keeps its thread until the system's resolver
    returns) a new name is unresolved at once rather than queued, so hostile names cannot hold the proxy's
    threads, stall it or delay its exit.
    """

    def __init__(self, *, timeout_s: float = 1.0, ttl_s: float = 30.0, failure_ttl_s: float = 5.0,
                 max_entries: int = 4096, max_lookups: int = 4) -> None:
        self.timeout_s = timeout_s
        self.ttl_s = ttl_s
        self.failure_ttl_s = failure_ttl_s
        self.max_entries = max_entries
        self.max_lookups = max_lookups
        self._answers: dict[str, tuple[float, frozenset[str] | str]] = {}
        self._inflight: dict[str, asyncio.Future[frozenset[str]]] = {}
        self._last: dict[str, frozenset[str]] = {}  # each name's last positive answer, kept past its ttl
        self._busy = 0  # lookups whose thread has not returned yet, given up or not
        self._lock = threading.Lock()

    async def servers(self, url: str) -> frozenset[Server]:
        """Every server ``url`` may connect to: its :func:`server`, and for a DNS name each address the name
        resolves to (as :func:`server` writes addresses). Empty when the URL names no server. Raises
        :class:`UnresolvedHost`."""
        first = server(url)
        if first is None:
            return frozenset()
        if not first.named:
            return frozenset({first})
        return _with_addresses(first, await self._addresses(first.host))

    def known(self, url: str) -> frozenset[Server] | None:
        """:meth:`servers` without any I/O: for a DNS name, from the last answer the name resolved to (however
        old); ``None`` for a name never resolved, or a URL without a readable server."""
        first = server(url)
        if first is None:
            return None
        if not first.named:
            return frozenset({first})
        last = self._last.get(first.host)
        return None if last is None else _with_addresses(first, last)

    async def _addresses(self, host: str) -> frozenset[str]:
        kept = self._answers.get(host)
        if kept is not None and kept[0] > time.monotonic():
            if isinstance(kept[1], str):
                raise UnresolvedHost(kept[1])
            return kept[1]
        pending = self._inflight.get(host)
        if pending is None:
            pending = asyncio.ensure_future(self._look_up(host))
            self._inflight[host] = pending
            pending.add_done_callback(functools.partial(self._finished, host))
        return await asyncio.shield(pending)

    def _finished(self, host: str, done: asyncio.Future[frozenset[str]]) -> None:
        self._inflight.pop(host, None)
        if not done.cancelled():
            done.exception()  # retrieved: a caller that went away leaves no "never retrieved" warning

    async def _look_up(self, host: str) -> frozenset[str]:
        with self._lock:
            if self._busy >= self.max_lookups:
                raise UnresolvedHost(f"{host[:128]!a} was not looked up: {self.max_lookups} lookups are still "
                                     "running")
            self._busy += 1
        loop = asyncio.get_running_loop()
        done: asyncio.Future[list[Any]] = loop.create_future()
        # A daemon thread of its own: one the system's resolver holds never delays the proxy's exit.
        threading.Thread(target=self._resolve, args=(host, loop, done), name="litellm-kv-dns", daemon=True).start()
        try:
            async with asyncio.timeout(self.timeout_s):
                infos = await done
            answer: frozenset[str] | str = frozenset(str(info[4][0]).split("%", 1)[0] for info in infos)
        except TimeoutError:
            answer = f"no answer for {host[:128]!a} within {self.timeout_s:g} s"
        except Exception as exc:  # OSError, UnicodeError, ValueError (a NUL in the name): no address either way
            answer = f"{host[:128]!a} does not resolve ({type(exc).__name__}: {str(exc)[:128]})"
        self._keep(host, answer)
        if isinstance(answer, str):
            raise UnresolvedHost(answer)
        return answer

    def _resolve(self, host: str, loop: asyncio.AbstractEventLoop, done: asyncio.Future[list[Any]]) -> None:
        """On the lookup's thread: the system's resolver, then the answer handed to the loop (if it still waits)."""
        try:
            infos: list[Any] | None = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
            error: Exception | None = None
        except Exception as exc:  # whatever the resolver raised is the caller's answer
            infos, error = None, exc
        finally:
            with self._lock:
                self._busy -= 1
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(_settle, done, infos, error)

    def _keep(self, host: str, answer: frozenset[str] | str) -> None:
        now = time.monotonic()
        if len(self._answers) >= self.max_entries:
            self._answers = {h: a for h, a in self._answers.items() if a[0] > now}
            while len(self._answers) >= self.max_entries:
                del self._answers[next(iter(self._answers))]
        ttl = self.failure_ttl_s if isinstance(answer, str) else self.ttl_s
        self._answers[host] = (now + ttl, answer)
        if not isinstance(answer, str):
            self._last.pop(host, None)
            while len(self._last) >= self.max_entries:
                del self._last[next(iter(self._last))]
            self._last[host] = answer
