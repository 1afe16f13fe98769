"""Which server a URL reaches (``litellm_kv.addresses``): every spelling of one address is one server, DNS names
are followed within a deadline, and hostile names cannot hold the resolver."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from litellm_kv import addresses
from litellm_kv.addresses import THIS_HOST, Resolver, Server, UnresolvedHost, server

LOOPBACK_SPELLINGS = [
    "http://127.0.0.1:8000/v1", "http://localhost:8000", "http://LOCALHOST:8000/", "http://localhost.:8000",
    "http://vllm.localhost:8000", "http://127.1:8000", "http://2130706433:8000", "http://0x7f.0.0.1:8000",
    "http://0177.0.0.1:8000", "http://127.0.0.2:8000", "http://[::1]:8000", "http://[::ffff:127.0.0.1]:8000",
    "http://0.0.0.0:8000", "http://[::]:8000",
]


@pytest.mark.parametrize("url", LOOPBACK_SPELLINGS)
def test_every_spelling_of_this_machine_is_one_server(url: str) -> None:
    assert server(url) == Server(THIS_HOST, 8000)


def test_an_address_of_this_machine_s_own_interfaces_is_this_machine() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:  # the interface a route out would use; no packet is sent
            probe.connect(("192.0.2.1", 9))
        except OSError:
            pytest.skip("this machine has no route off loopback")
        own = probe.getsockname()[0]
    assert server(f"http://{own}:8000") == Server(THIS_HOST, 8000)


@pytest.mark.parametrize(("url", "expected"), [
    ("http://10.1.2.3:8000/v1", Server("10.1.2.3", 8000)),
    ("http://[2001:db8::1]:8000", Server("2001:db8::1", 8000)),
    ("http://[::ffff:10.1.2.3]:8000", Server("10.1.2.3", 8000)),
    ("http://012.1.2.3:8000", Server("10.1.2.3", 8000)),  # octal, as the C library reads it
    ("https://Engine.Example.:8443/v1", Server("engine.example", 8443, named=True)),
    ("https://engine.example/v1", Server("engine.example", 443, named=True)),
    ("http://engine.example/v1", Server("engine.example", 80, named=True)),
])
def test_other_servers_keep_their_address_and_port(url: str, expected: Server) -> None:
    assert server(url) == expected


@pytest.mark.parametrize("url", ["http://h:port/v1", "http:///v1", "", "not a url"])
def test_a_url_without_a_readable_server_is_none(url: str) -> None:
    assert server(url) is None


def test_ports_tell_servers_apart() -> None:
    assert server("http://localhost:8000") != server("http://localhost:8001")
    assert server("http://10.0.0.1") != server("https://10.0.0.1")


async def test_a_dns_name_reaches_the_addresses_it_resolves_to() -> None:
    name = socket.gethostname()
    servers = await Resolver().servers(f"http://{name}:8000/v1")
    assert Server(name.lower(), 8000, named=True) in servers
    assert {s for s in servers if not s.named}, servers  # at least one address
    assert Server(THIS_HOST, 8000) in servers  # this machine's own name


async def test_a_name_that_does_not_resolve_is_unresolved_and_the_failure_is_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = socket.getaddrinfo

    def counted(host: str, *args: object, **kw: object) -> object:
        calls.append(host)
        return real(host, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", counted)
    resolver = Resolver()
    for _ in range(3):
        with pytest.raises(UnresolvedHost, match="does not resolve"):
            await resolver.servers("http://nowhere.invalid:8000")
    assert calls == ["nowhere.invalid"]


async def test_a_lookup_that_hangs_is_given_up_and_hostile_names_cannot_hold_more_threads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver that never answers (a hostile name's DNS server): each lookup is given up at the deadline, at
    most ``max_lookups`` threads are held, and a name beyond them is refused at once, not queued."""
    release = threading.Event()
    started: list[str] = []

    def hung(host: str, *args: object, **kw: object) -> object:
        started.append(host)
        release.wait(10)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", hung)
    resolver = Resolver(timeout_s=0.1, max_lookups=2)
    try:
        t0 = time.monotonic()
        results = await asyncio.gather(*(resolver.servers(f"http://h{i}.example:80") for i in range(5)),
                                       return_exceptions=True)
        assert time.monotonic() - t0 < 1.0
        assert all(isinstance(r, UnresolvedHost) for r in results)
        assert sorted(started) == ["h0.example", "h1.example"]
        assert sum("within 0.1 s" in str(r) for r in results) == 2
        assert sum("lookups are still running" in str(r) for r in results) == 3
        with pytest.raises(UnresolvedHost, match="still running"):  # the two threads are still held
            await resolver.servers("http://h9.example:80")
        held = [t for t in threading.enumerate() if t.name == "litellm-kv-dns"]
        assert len(held) >= 2 and all(t.daemon for t in held)  # none delays the process's exit
    finally:
        release.set()
    for _ in range(100):  # the threads come back: lookups run again
        if resolver._busy == 0:
            break
        await asyncio.sleep(0.01)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [(socket.AF_INET, socket.SOCK_STREAM, 6, "",
                                                                    ("10.9.8.7", 0))])
    assert Server("10.9.8.7", 80) in await resolver.servers("http://h9.example:80")


async def test_one_name_is_looked_up_once_by_concurrent_callers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def slow(host: str, *args: object, **kw: object) -> object:
        calls.append(host)
        time.sleep(0.05)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.9", 0))]

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    resolver = Resolver()
    answers = await asyncio.gather(*(resolver.servers("http://engine.example:8000") for _ in range(8)))
    assert calls == ["engine.example"] and len(set(answers)) == 1
    assert Server("10.0.0.9", 8000) in answers[0]


def test_the_kept_answers_are_bounded() -> None:
    resolver = Resolver(max_entries=3)
    for i in range(10):
        resolver._keep(f"h{i}", frozenset({"10.0.0.1"}))
    assert len(resolver._answers) <= 3 and "h9" in resolver._answers


def test_literal_addresses_are_read_as_a_connection_reads_them() -> None:
    assert str(addresses.literal_address("127.1")) == "127.0.0.1"
    assert str(addresses.literal_address("0x7f000001")) == "127.0.0.1"
    assert addresses.literal_address("engine") is None
    assert addresses.literal_address("1.2.3.4.5") is None


def test_where_the_system_binds_any_address_only_loopback_is_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``net.ipv4.ip_nonlocal_bind`` every bind succeeds, so binding tells nothing: other addresses stay
    themselves rather than all becoming this machine (which would match unrelated servers on the same port)."""
    monkeypatch.setattr(addresses, "_binds", lambda ip: True)
    addresses.is_this_host.cache_clear()
    addresses._binding_tells.cache_clear()
    try:
        assert server("http://10.9.9.9:8000") == Server("10.9.9.9", 8000)
        assert server("http://127.0.0.1:8000") == Server(THIS_HOST, 8000)
    finally:
        addresses.is_this_host.cache_clear()
        addresses._binding_tells.cache_clear()
