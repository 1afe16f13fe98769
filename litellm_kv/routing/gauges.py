"""The engines' scraped queue gauges, aged by what this process has seen since the scrape.

``vllm:num_requests_waiting`` and ``vllm:num_requests_running`` are read every ``scrape_interval_s``; between
two scrapes the figures describe the past. The router's own in-flight counts are current but miss traffic
from other routers, so the cost uses the larger of the two — and a scrape taken while this process's own
requests were queued keeps counting them after they have left: one stale "waiting" on an idle replica is
priced as a full queued request and can send a conversation away from its cache.

:class:`GaugeAging` removes those: a request of this process that began before a scrape started was in that
scrape's counts; once it leaves the queue (first token) it is taken off ``waiting``, and once it ends after
having had its first token before the scrape, off ``running``. Requests that began after the scrape started
are never taken off (they were not in it). A non-streaming request's first token is only known at its end,
so it is taken off ``waiting`` even if the engine counted it as running: that may undercount other routers'
queued requests until the next scrape, never this process's own (the router's in-flight counts stand).

Memory: one small record per request in flight and per replica.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Replica:
    epoch: int = 0  # scrapes started
    gauges_epoch: int = -1  # ``epoch`` when the scrape whose gauges are in use started (-1: none yet)
    left_waiting: int = 0  # requests in that scrape's waiting count that have left the queue since
    left_running: int = 0  # requests in that scrape's running count that have ended since


@dataclass(slots=True)
class _Request:
    replica: str
    began: int  # the replica's ``epoch`` when the request began
    first: int | None = None  # ... when its first token came (None: not yet)


class GaugeAging:
    """Per replica, how many of the last scrape's waiting and running requests were this process's and have
    left since."""

    def __init__(self) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._requests: dict[str, _Request] = {}

    def _rep(self, replica: str) -> _Replica:
        rep = self._replicas.get(replica)
        if rep is None:
            rep = self._replicas[replica] = _Replica()
        return rep

    # -- scrapes ---------------------------------------------------------------------------------------
    def scrape_started(self, replica: str) -> int:
        """A scrape of ``replica`` is being sent; returns the token to hand to :meth:`scraped`."""
        rep = self._rep(replica)
        rep.epoch += 1
        return rep.epoch

    def scraped(self, replica: str, token: int) -> None:
        """The gauges of the scrape started with ``token`` are now in use. Requests that left while it was
        under way may or may not be in its counts: they are left in (an overcount until the next scrape)."""
        rep = self._rep(replica)
        rep.gauges_epoch = token
        rep.left_waiting = rep.left_running = 0

    def forget(self, replica: str) -> None:
        self._replicas.pop(replica, None)

    # -- this process's requests ---------------------------------------------------------------------
    def begin(self, request_id: str, replica: str) -> None:
        self._requests[request_id] = _Request(replica, self._rep(replica).epoch)

    def first_token(self, request_id: str) -> None:
        req = self._requests.get(request_id)
        if req is None or req.first is not None:
            return
        rep = self._replicas.get(req.replica)
        if rep is None:
            return
        req.first = rep.epoch
        if req.began < rep.gauges_epoch:
            rep.left_waiting += 1

    def end(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        rep = self._replicas.get(req.replica)
        if rep is None:
            return
        if req.first is None:
            # Ended without a first token seen (a non-streaming response, an error): it has left the queue.
            if req.began < rep.gauges_epoch:
                rep.left_waiting += 1
        elif req.first < rep.gauges_epoch:
            rep.left_running += 1

    # -- reading ---------------------------------------------------------------------------------------
    def adjust(self, replica: str, waiting: int | None, running: int | None) -> tuple[int | None, int | None]:
        """The scraped ``waiting`` and ``running`` of ``replica`` less this process's requests that have left
        them since (never below zero; None stays None)."""
        rep = self._replicas.get(replica)
        if rep is None:
            return waiting, running
        if waiting is not None:
            waiting = max(0, waiting - rep.left_waiting)
        if running is not None:
            running = max(0, running - rep.left_running)
        return waiting, running

    def in_flight(self) -> int:
        return len(self._requests)
