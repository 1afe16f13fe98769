"""The engines' scraped queue gauges, aged by what this process has seen since the scrape.

``vllm:num_requests_waiting`` and ``vllm:num_requests_running`` are read every ``scrape_interval_s``; between
two scrapes the figures describe the past. The router's own in-flight counts are current but miss traffic
from other routers, so the cost uses the larger of the two — and a scrape taken while this process's own
requests were queued keeps counting them after they have left: one stale "waiting" on an idle replica is
priced as a full queued request and can send a conversation away from its cache.

:class:`GaugeAging` removes those. A request of this process that began before a scrape started was in that
scrape's ``waiting`` or ``running`` count (vLLM counts a request being prefilled as running). Since then:

* one that had its first token before the scrape and has ended was running: it comes off ``running``;
* one that has had its first token since, and still runs, cannot be waiting any more: it comes off ``waiting``
  (and, if it was counted there, is now running: added to ``running``), up to the scraped ``waiting``;
* one that has ended without a first token before the scrape (its first token since, or a non-streaming
  response, whose first token is only known with its end) comes off ``waiting`` first, then off ``running``.

Requests that began after the scrape started are never taken off (they were not in it), nor are those that left
while it was under way (they may or may not be in it). The counts never go below zero. The split between
``waiting`` and ``running`` is a guess where the router cannot know it; the error is bounded by this process's
requests that left within one scrape interval and affects only other routers' requests (the router's own
in-flight counts stand beside the aged figures).

Memory: one small record per request in flight and per replica.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class _Replica:
    epoch: int = 0  # scrapes started
    gauges_epoch: int = -1  # ``epoch`` when the scrape whose gauges are in use started (-1: none yet)
    # Of the requests in that scrape's counts:
    moved: int = 0  # first token since, still running
    gone: int = 0  # ended, with no first token before the scrape (waiting or running then)
    gone_running: int = 0  # ended, with their first token before the scrape (running then)


@dataclass(slots=True)
class _Request:
    replica: str
    began: int  # the replica's ``epoch`` when the request began
    first: int | None = None  # ... when its first token came (None: not yet)
    moved_in: int | None = None  # ``gauges_epoch`` of the scrape whose ``moved`` counts it


class GaugeAging:
    """Per replica, which of the last scrape's waiting and running requests were this process's and have
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
        rep.moved = rep.gone = rep.gone_running = 0

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
            rep.moved += 1
            req.moved_in = rep.gauges_epoch

    def end(self, request_id: str) -> None:
        req = self._requests.pop(request_id, None)
        if req is None:
            return
        rep = self._replicas.get(req.replica)
        if rep is None or req.began >= rep.gauges_epoch:
            return
        if req.moved_in == rep.gauges_epoch:
            rep.moved -= 1
            rep.gone += 1
        elif req.first is not None and req.first < rep.gauges_epoch:
            rep.gone_running += 1
        else:
            rep.gone += 1

    # -- reading ---------------------------------------------------------------------------------------
    def adjust(self, replica: str, waiting: int | None, running: int | None) -> tuple[int | None, int | None]:
        """The scraped ``waiting`` and ``running`` of ``replica`` less this process's requests that have left
        them since (module docstring; never below zero; None stays None)."""
        rep = self._replicas.get(replica)
        if rep is None:
            return waiting, running
        moved = gone_waiting = 0
        if waiting is not None:
            moved = min(waiting, rep.moved)
            gone_waiting = min(waiting - moved, rep.gone)
            waiting -= moved + gone_waiting
        if running is not None:
            running = max(0, running + moved - (rep.gone - gone_waiting) - rep.gone_running)
        return waiting, running

    def in_flight(self) -> int:
        return len(self._requests)
