"""Keeping the cyclic collector's full passes off the serving loop.

A decision server holds a large, long-lived heap: the registry's instances, groups and
indexes, about 430,000 objects the collector tracks at 100,000 instances. CPython rescans
all of it in every full collection, which it starts on its own once enough objects have
survived since the last one. Measured here (`benchmarks/RESULTS.md`, serve, ninth pass): a
280–356 ms pause every few minutes at 1,000 decisions/s, with every call in flight waiting
it out. `gc.freeze()` moves what is alive to a permanent generation that collections
skip; reference counting still frees it when it goes.

The settler does that after the registry changes (a fleet loaded, a trickle of
registrations, a reload), at most once per `interval`. It collects first, so that garbage
is not frozen, and that collection scans only what is not frozen yet. After a reload it
unfreezes first, so that the previous state, whose indexes hold reference cycles, can be
freed: one full pass per reload instead of one every few minutes.

Between two passes the serving heap grows again: request-shape entries, matcher plans and
placer memos, each cache bounded but filled after the freeze. The collector's own full
passes then rescan all of it: measured here at 20,000 instances after the diverse mix had
been served once, ~45,000 unfrozen objects with ~300,000 references between them and into
the frozen heap took 18-61 ms a pass, and a paced soak at 1,900 decisions/s met one every
7-10 s (44-53 ms each), every call in flight waiting it out. So once settled, the settler
also freezes what survives each full pass (`gc.callbacks`, at the end of a generation-2
collection): a full pass leaves no garbage behind and the younger generations empty, so
that freeze is the settler's own collect-and-freeze without a pass of its own, and the next
full pass scans only what survived since (in the same soak: 20-41 ms; what is left is the
caches' turnover between two passes). The price is the settler's own: an object frozen that
later becomes garbage inside a reference cycle waits for the next unfreeze (the next reload)
instead of the next full pass; measured after that soak (six passes frozen), 6 such objects.

The young passes rescanned the serving heap too. What survives one young pass (a tick's
tables and plan parts, memo entries, requests in flight) is promoted and rescanned by every
generation-1 pass until it reaches the oldest generation, whose growth then starts a full
pass: measured on the serve benchmark's paced phase (20,000 instances, diverse mix, 30 s at
1,000 decisions/s, load 4), 273 generation-0 passes (median 0.78 ms), 25 generation-1
(median 3.5 ms, 13.8 ms at most) and two full passes (63 and 101 ms). So once settled the
settler also freezes what survives each young pass: that pass has just collected the young
garbage (cycles among it included), so only live objects are frozen, the next young pass
scans only what came after it, and as a freeze resets the generations' counts, no
generation-1 or full pass starts on its own any more. Same phase, load 2: 188 generation-0
passes (median 0.49 ms, 1.9 ms at most), none older. Freezing on every refresher tick
instead (without the pass) froze each tick's cyclic garbage too: 10,562 gRPC method
look-ups (each a cycle of five objects) in 30 s. After a young pass what leaks is what was
alive in a cycle at the pass and died later (a look-up the pass interrupted): measured 6 in
30 s. To bound that, the settler unfreezes and collects everything every `full_every`
(an hour by default): one full pass an hour, where there were several a minute.

The freeze is process-wide, so the process decides: `ServeConfig.settle_heap`, which
`policyc serve`, the demo and the benchmarks turn on, and tests leave off.
"""

from __future__ import annotations

import gc
import math
import time
import weakref
from collections import deque
from typing import Any, Callable, Protocol

from .state import PolicyState

DEFAULT_INTERVAL = 30.0  # seconds: at most one settling pass this often
FULL_EVERY = 3600.0  # seconds: once settled, unfreeze and collect everything this often (what froze in cycles)


class _Engine(Protocol):
    @property
    def generation(self) -> int: ...

    @property
    def state(self) -> PolicyState: ...


class HeapSettler:
    """`settle_if_changed()` after the registry or the policy state changed; also a
    refresher listener (`__call__`), so it runs on the refresher's tick."""

    def __init__(self, engine: _Engine, interval: float = DEFAULT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic, *, full_every: float = FULL_EVERY,
                 freeze_young: bool = True) -> None:
        self._engine = engine
        self.interval = interval
        self.full_every = full_every
        self.freeze_young = freeze_young  # once settled, freeze what survives each young pass too
        self._full_at = -math.inf  # when the last pass collected everything (nothing frozen before it)
        self._clock = clock
        self._generation: int | None = None
        self._state: PolicyState | None = None
        self._at = -math.inf
        self.passes: deque[float] = deque(maxlen=100)  # seconds the recent settling passes took (collect and freeze)
        self.refrozen = 0  # full passes of the collector whose survivors were frozen after them
        self.young_refrozen = 0  # young passes whose survivors were frozen after them
        self._unhook: weakref.finalize | None = None  # takes the hook out of gc.callbacks (release, or this settler gone)

    def settle_if_changed(self) -> bool:
        """Collect and freeze if the registry or the state changed since the last pass
        and the last pass is `interval` seconds old, or everything was last collected
        `full_every` seconds ago; True if it did."""
        generation, state = self._engine.generation, self._engine.state
        now = self._clock()
        due = self._state is not None and now - self._full_at >= self.full_every
        if generation == self._generation and state is self._state and not due:
            return False
        if now - self._at < self.interval:
            return False
        t = time.perf_counter()
        if self._state is not None and (state is not self._state or due):
            self._state = None  # not kept alive by this reference either
            gc.unfreeze()  # the old state is frozen with its cycles, or what froze in cycles since: let this pass free it
        if self._state is None:
            self._full_at = now  # nothing frozen: this pass collects everything
        gc.collect()
        gc.freeze()
        self.passes.append(time.perf_counter() - t)
        self._generation, self._state, self._at = generation, state, now
        if self._unhook is None:
            hook = _freeze_after_passes(weakref.ref(self))
            gc.callbacks.append(hook)
            self._unhook = weakref.finalize(self, gc.callbacks.remove, hook)
        return True

    def __call__(self, new: object, previous: object) -> None:
        self.settle_if_changed()

    def release(self) -> None:
        """Unfreeze (the server stopped): what it held is collected as usual again."""
        if self._unhook is not None:
            self._unhook()
            self._unhook = None
        if self._state is not None:
            gc.unfreeze()
            self._generation = self._state = None
            self._at = -math.inf


def _freeze_after_passes(settler: "weakref.ref[HeapSettler]") -> Callable[[str, dict[str, Any]], None]:
    """The `gc.callbacks` hook of a settled settler: at the end of each full pass, and of
    each younger one while `freeze_young`, freeze its survivors (see the module's
    docstring). It holds the settler weakly, so a settler dropped without `release` (in a
    test, say) takes its hook with it."""

    def after_collection(phase: str, info: dict[str, Any]) -> None:
        s = settler()
        if s is None or phase != "stop" or s._state is None:
            return
        if info["generation"] == 2:
            gc.freeze()
            s.refrozen += 1
        elif s.freeze_young:
            gc.freeze()
            s.young_refrozen += 1

    return after_collection
