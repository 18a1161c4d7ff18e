"""Measured model-server load: every registered endpoint's Prometheus `/metrics`, scraped on
a tick (default 50 ms, the Inference Extension's), read with the metric names of its server
kind (`server_metric_names.PROTOCOLS`), kept with its age.

    scraper = MetricsScraper(interval_s=0.05).start()      # its own thread and event loop
    scraper.add("127.0.0.1:8000", "vllm")                  # or follow(registry instances)
    r = scraper.snapshot("127.0.0.1:8000")                 # EndpointReading or None (never scraped)
    r.values["queue_depth"], r.age_s, r.stale, r.source
    scraper.stop()

Each endpoint has one task on the scraper's event loop and one kept-alive HTTP/1.1
connection; a scrape is bounded (`timeout_s` for connect, request and body; a body larger
than `metrics_text.MAX_BODY_BYTES` is refused), a tick that a slow scrape overran is skipped,
never queued, and endpoints' ticks are spread over the interval so 100 endpoints do not
scrape in one burst. A failed scrape keeps the last values, whose age then grows: a reader
sees `stale` once the age passes `max_age_s` and `error` says why — never an old number
passed off as fresh. A server that can render only the wanted series (vLLM, SGLang:
`server_metric_names.narrowed_path`) is asked for those alone (vLLM: 0.6 ms of its CPU a
scrape instead of 3.7); one that does not answer that page is scraped whole. `snapshot`
reads an immutable record the loop replaces, so it takes no lock and may be called from any
thread (the placer's refresher, the gateway).

**The fleet-wide budget.** A 50 ms tick is cheap for a few endpoints and not for a fleet:
every scrape costs the scraper's CPU and the model server's (vLLM renders a ~50 KB page per
answer, about a millisecond of its API server's Python). So the tick each endpoint is
actually scraped on, `tick_s`, is the configured `interval_s` stretched to keep the whole
fleet within two bounds: `max_scrapes_per_s` (scrapes a second over all endpoints, default
200: the servers' side, which the scraper cannot measure) and `cpu_budget` (cores of the
scraper's own thread, default 0.25: measured, the thread's CPU time over the scrapes of the
last window, so a dearer page or a slower machine stretches the tick by itself). A small
fleet keeps `interval_s` (200 scrapes/s is 10 endpoints at 50 ms); 32 endpoints are read
every 160 ms, 100 every 500 ms; never slower than `MAX_TICK_S`. The tick in use travels with
every reading (`EndpointReading.tick_s`, `Reading.tick_s`) and staleness follows it: a
reading is stale after `readings.STALE_TICKS` of the ticks actually used (at least
`max_age_s`), so nothing is flagged stale by the budget itself.

`stats()` reports scrapes, failures, the loop thread's CPU seconds, the tick in use and the
measured CPU a scrape: the cost of scraping, measured (`benchmarks/metrics_scrape.py`).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping, NamedTuple

from .metrics_text import MAX_BODY_BYTES, CompiledMap, compile_map, read_figures
from .readings import STALE_TICKS, Reading
from .server_metric_names import MetricMap, narrowed_path, protocol

log = logging.getLogger("policyc.placer.metrics_scraper")
DEFAULT_INTERVAL_S = 0.05
DEFAULT_TIMEOUT_S = 1.0
MAX_HEADER_BYTES = 64 * 1024
METRICS_LABEL = "metrics"  # an instance label naming its server kind (`vllm`, `sglang`, ...): `follow` scrapes it
DEFAULT_MAX_SCRAPES_PER_S = 200.0  # over the whole fleet: 10 endpoints at 50 ms, 32 at 160 ms, 100 at 500 ms
DEFAULT_CPU_BUDGET = 0.25  # cores of the scraper's own thread (measured; 100 endpoints at 50 ms cost ~0.23 here)
MAX_TICK_S = 5.0  # the budget never stretches an endpoint's tick past this (or past interval_s, if larger)
BUDGET_WINDOW_S = 1.0  # how often the CPU a scrape costs is re-measured and the tick re-set
RETICK_CHANGE = 0.1  # a new tick is taken when it differs from the one in use by more than this share


class EndpointReading(NamedTuple):
    """One endpoint's latest figures by key, how old they are, and where they came from."""

    values: Mapping[str, float]
    age_s: float  # since the scrape that read them (inf: no scrape has succeeded yet)
    source: str  # "vllm http://127.0.0.1:8000/metrics"
    stale: bool  # age_s > the stale bound at the tick in use (`MetricsScraper.stale_after_s`)
    scraped_at: float  # wall-clock time of that scrape (0: none yet)
    error: str | None  # why the latest attempt failed, when it did
    tick_s: float  # the tick this endpoint is scraped on now (interval_s, stretched by the fleet budget)


@dataclass(frozen=True, slots=True)
class _State:
    values: Mapping[str, float]
    at: float  # monotonic time of the last good scrape (-inf: none)
    wall: float
    error: str | None


@dataclass(frozen=True, slots=True)
class ScrapeStats:
    endpoints: int
    scrapes: int
    failures: int
    cpu_s: float  # CPU seconds of the scraper's thread since start
    wall_s: float  # seconds since start
    tick_s: float = 0.0  # the per-endpoint tick in use (interval_s stretched by the fleet budget)
    cpu_per_scrape_s: float = float("nan")  # measured over the last window (NaN: not measured yet)
    budget: str = ""  # what sets the tick: "interval", "scrapes/s" or "cpu"


class _Target:
    def __init__(self, endpoint: str, kind: str, wanted: CompiledMap, path: str, narrowed: str | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"endpoint `{endpoint}`: expected host:port")
        self.endpoint, self.kind, self.wanted, self.whole = endpoint, kind, wanted, path
        self.host, self.port = host.strip("[]"), int(port)
        self.narrowed = narrowed is not None  # asking for the map's series only (`server_metric_names.narrowed_path`)
        self._ask(narrowed if narrowed is not None else path)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.task: asyncio.Task[None] | None = None

    def _ask(self, path: str) -> None:
        self.path = path
        shown = path.split("?", 1)[0] + (f" (its {len(self.wanted.by_name)} series: name[])" if "?" in path else "")
        self.source = f"{self.kind} http://{self.endpoint}{shown}"
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {self.endpoint}\r\nAccept: text/plain\r\n"
                        "Accept-Encoding: identity\r\nUser-Agent: policyc-scraper\r\n\r\n").encode()

    def widen(self) -> None:
        """Scrape the whole page from now on: the server did not answer the narrowed one."""
        self.narrowed = False
        self._ask(self.whole)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class MetricsScraper:
    """Scrape every added endpoint's `/metrics` each `interval_s`; `snapshot` reads the result."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_age_s: float | None = None, max_scrapes_per_s: float = DEFAULT_MAX_SCRAPES_PER_S,
                 cpu_budget: float = DEFAULT_CPU_BUDGET) -> None:
        """`max_scrapes_per_s` and `cpu_budget` bound the whole fleet (see the module); `math.inf`
        turns either off, so every endpoint is scraped each `interval_s` whatever it costs."""
        if not interval_s > 0 or not timeout_s > 0:
            raise ValueError(f"interval_s {interval_s!r} and timeout_s {timeout_s!r} must be positive")
        if not (max_scrapes_per_s > 0 and cpu_budget > 0):
            raise ValueError(f"max_scrapes_per_s {max_scrapes_per_s!r} and cpu_budget {cpu_budget!r} must be positive")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_age_s = max_age_s if max_age_s is not None else max(STALE_TICKS * interval_s, 0.25)
        self.max_scrapes_per_s = max_scrapes_per_s
        self.cpu_budget = cpu_budget
        self._tick_s = interval_s  # the tick in use (set by `_retick`)
        self._budget = "interval"
        self._cpu_per_scrape = float("nan")  # measured by `_measure` each BUDGET_WINDOW_S
        self._budget_task: asyncio.Task[None] | None = None
        self._states: dict[str, _State] = {}
        self._targets: dict[str, _Target] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._scrapes = 0
        self._failures = 0
        self._started = 0.0

    # ------------------------------------------------------------------ life cycle
    def start(self) -> MetricsScraper:
        """Run the scraper's event loop in a daemon thread of its own."""
        if self._thread is not None:
            raise RuntimeError("the scraper is already started")
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._budget_task = loop.create_task(self._measure())
            ready.set()
            loop.run_forever()
            for t in self._targets.values():
                t.close()
            loop.close()

        self._started = time.monotonic()
        self._thread = threading.Thread(target=run, name="policyc-metrics-scraper", daemon=True)
        self._thread.start()
        ready.wait()
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            tasks = [t.task for t in self._targets.values() if t.task is not None]
            if self._budget_task is not None:
                tasks.append(self._budget_task)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> MetricsScraper:
        return self.start() if self._thread is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ endpoints
    def add(self, endpoint: str, kind: str = "vllm", *, metric_map: MetricMap | None = None, path: str = "/metrics") -> None:
        """Scrape `endpoint` (host:port) as a server of `kind` (its row of the table), or
        with its own `metric_map`; adding it again replaces its kind."""
        m = metric_map if metric_map is not None else protocol(kind)
        narrowed = narrowed_path(kind, m) if metric_map is None and path == "/metrics" else None
        target = _Target(endpoint, kind, compile_map(m), path, narrowed)
        self._call(self._add, target)

    def remove(self, endpoint: str) -> None:
        self._call(self._remove, endpoint)

    def follow(self, instances: Iterable[object]) -> None:
        """Scrape exactly the endpoints of `instances` (registry `Instance`s) that carry a
        `metrics` label naming their server kind; stop scraping the others."""
        want: dict[str, str] = {}
        for inst in instances:
            endpoint = inst.deployment.endpoint  # type: ignore[attr-defined]
            kind = inst.labels.get(METRICS_LABEL)  # type: ignore[attr-defined]
            if endpoint and kind:
                want[endpoint] = kind
        for endpoint in [e for e in list(self._targets) if e not in want]:
            self.remove(endpoint)
        for endpoint, kind in want.items():
            t = self._targets.get(endpoint)
            if t is None or t.kind != kind:
                self.add(endpoint, kind)

    @property
    def endpoints(self) -> list[str]:
        return sorted(self._targets)

    @property
    def tick_s(self) -> float:
        """The per-endpoint tick in use: `interval_s`, stretched by the fleet budget."""
        return self._tick_s

    def stale_after_s(self) -> float:
        """The age past which a reading is stale at the tick in use (never below `max_age_s`)."""
        return max(self.max_age_s, STALE_TICKS * self._tick_s)

    def tick_for(self, endpoints: int, cpu_per_scrape_s: float) -> tuple[float, str]:
        """The tick `endpoints` endpoints are scraped on under the budget, and which bound set
        it ("interval", "scrapes/s", "cpu"); `cpu_per_scrape_s` NaN: not measured yet."""
        tick, why = self.interval_s, "interval"
        by_rate = endpoints / self.max_scrapes_per_s
        if by_rate > tick:
            tick, why = by_rate, "scrapes/s"
        if cpu_per_scrape_s > 0:  # NaN compares False: not measured yet
            by_cpu = endpoints * cpu_per_scrape_s / self.cpu_budget
            if by_cpu > tick:
                tick, why = by_cpu, "cpu"
        cap = max(self.interval_s, MAX_TICK_S)
        return (cap, why) if tick > cap else (tick, why)

    def _retick(self, *, measured: bool = False) -> None:
        """Re-set the tick in use from the fleet's size and the measured CPU a scrape (on the
        loop); after a new measurement (`measured`) only a change over RETICK_CHANGE is taken,
        so the tick does not jitter with the measurement's noise."""
        tick, why = self.tick_for(len(self._targets), self._cpu_per_scrape)
        if not measured or abs(tick - self._tick_s) > RETICK_CHANGE * self._tick_s or why != self._budget:
            self._tick_s, self._budget = tick, why

    async def _measure(self) -> None:
        """Each BUDGET_WINDOW_S: the loop thread's CPU over the scrapes attempted in the window
        (a scrape's own work and its share of the loop's), smoothed, then `_retick`."""
        cpu0, n0 = time.thread_time(), self._scrapes + self._failures
        while True:
            await asyncio.sleep(BUDGET_WINDOW_S)
            cpu1, n1 = time.thread_time(), self._scrapes + self._failures
            if n1 - n0 >= 10:  # enough scrapes to price one
                each = (cpu1 - cpu0) / (n1 - n0)
                old = self._cpu_per_scrape
                self._cpu_per_scrape = each if old != old else 0.5 * old + 0.5 * each  # NaN: the first window
                cpu0, n0 = cpu1, n1
            self._retick(measured=True)

    def _call(self, fn, arg) -> None:  # type: ignore[no-untyped-def]
        loop = self._loop
        if loop is None:
            raise RuntimeError("start the scraper first")
        done = threading.Event()

        def go() -> None:
            try:
                fn(arg)
            finally:
                done.set()

        loop.call_soon_threadsafe(go)
        done.wait(10)

    def _add(self, target: _Target) -> None:
        self._remove(target.endpoint)
        self._targets[target.endpoint] = target
        self._states.setdefault(target.endpoint, _State(MappingProxyType({}), float("-inf"), 0.0, None))
        self._retick()
        target.task = asyncio.get_running_loop().create_task(self._run(target))

    def _remove(self, endpoint: str) -> None:
        t = self._targets.pop(endpoint, None)
        if t is not None:
            if t.task is not None:
                t.task.cancel()
            t.close()
            self._retick()
        self._states.pop(endpoint, None)

    # ------------------------------------------------------------------ reading
    def snapshot(self, endpoint: str) -> EndpointReading | None:
        """The endpoint's latest figures with their age; None when it is not scraped."""
        s = self._states.get(endpoint)
        t = self._targets.get(endpoint)
        if s is None or t is None:
            return None
        age = time.monotonic() - s.at
        return EndpointReading(s.values, age, t.source, not age <= self.stale_after_s(), s.wall, s.error, self._tick_s)

    def reading(self, endpoint: str) -> Reading | None:
        """The placer's shape (`readings.Reading`, with the tick in use) for
        `measured.by_endpoint`; None before a first good scrape (no figures yet is not a reading)."""
        r = self.snapshot(endpoint)
        return None if r is None or not r.values else Reading(r.values, r.age_s, r.tick_s)

    def stats(self) -> ScrapeStats:
        """Scrapes, failures and the scraper thread's CPU time since start (read on its loop)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("start the scraper first")

        async def cpu() -> float:
            return time.thread_time()

        cpu_s = asyncio.run_coroutine_threadsafe(cpu(), loop).result(10)
        return ScrapeStats(len(self._targets), self._scrapes, self._failures, cpu_s, time.monotonic() - self._started,
                           self._tick_s, self._cpu_per_scrape, self._budget)

    # ------------------------------------------------------------------ the loop
    async def _run(self, t: _Target) -> None:
        await asyncio.sleep(random.uniform(0, self._tick_s))  # spread endpoints over the tick
        next_at = time.monotonic()
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    values, problems = await self._scrape(t)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # any failed scrape (refused, timed out, malformed): stale with its reason, never a dead task
                t.close()
                self._failures += 1
                old = self._states.get(t.endpoint)
                if old is not None:
                    reason = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
                    self._states[t.endpoint] = _State(old.values, old.at, old.wall, f"{t.source}: {reason}"[:300])
            else:
                self._scrapes += 1
                self._states[t.endpoint] = _State(MappingProxyType(values), time.monotonic(), time.time(),
                                                  f"{t.source}: {'; '.join(problems)[:300]}" if problems else None)
            now = time.monotonic()
            tick = self._tick_s  # the fleet budget's, read each round: a change applies from the next scrape
            next_at += tick
            if next_at < now:  # a slow scrape overran: skip the missed ticks
                next_at = now + tick - (now - next_at) % tick
            await asyncio.sleep(next_at - now)

    async def _scrape(self, t: _Target) -> tuple[dict[str, float], list[str]]:
        if t.writer is None or t.reader is None:
            t.reader, t.writer = await asyncio.open_connection(t.host, t.port, limit=MAX_HEADER_BYTES)
        t.writer.write(t.request)
        head = await t.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP/1.1 answer: `{lines[0][:60].decode(errors='replace')}`")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip().lower()
        if headers.get(b"content-length") is not None:
            n = int(headers[b"content-length"])
            if n > MAX_BODY_BYTES:
                raise ValueError(f"metrics page of {n:,} bytes; at most {MAX_BODY_BYTES:,} are read")
            body = await t.reader.readexactly(n)
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = await self._chunked(t.reader)
        else:
            raise ValueError("an answer without Content-Length or chunked encoding")
        if headers.get(b"connection") == b"close":
            t.close()
        status = int(parts[1])
        figures = read_figures(body, t.wanted) if status == 200 else ({}, [])
        if t.narrowed and not figures[0]:  # not the narrowed page (a 404, a redirect, another app): the whole one
            log.info("metrics scraper: %s answered HTTP %d without its series; scraping %s from now", t.source, status, t.whole)
            t.widen()
            return await self._scrape(t)
        if status != 200:
            raise ValueError(f"HTTP {status}")
        return figures

    @staticmethod
    async def _chunked(reader: asyncio.StreamReader) -> bytes:
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers expected: the empty line
                return bytes(out)
            if len(out) + size > MAX_BODY_BYTES:
                raise ValueError(f"metrics page over {MAX_BODY_BYTES:,} bytes")
            out += await reader.readexactly(size)
            await reader.readexactly(2)


__all__ = ["DEFAULT_CPU_BUDGET", "DEFAULT_MAX_SCRAPES_PER_S", "EndpointReading", "METRICS_LABEL", "MetricsScraper",
           "ScrapeStats"]
