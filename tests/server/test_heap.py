"""The heap settler: freezes the long-lived heap after the registry or the policy state
changes, at most once per interval, and lets a replaced state's reference cycles go."""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from server_rig import SMALL, start  # noqa: E402

from policyc.client import operator_channel
from policyc.compiler.bundle import Bundle  # noqa: E402
from policyc.server.config import ServeConfig  # noqa: E402
from policyc.server.heap import HeapSettler  # noqa: E402
from server_support import bundle  # noqa: E402,F401


class Node:
    """Part of a reference cycle, as the registry's groups and tiers are."""

    def __init__(self) -> None:
        self.other: Node | None = None


class State:
    def __init__(self) -> None:
        a, b = Node(), Node()
        a.other, b.other = b, a
        self.cycle = a


class Engine:
    def __init__(self) -> None:
        self.generation = 0
        self.state = State()


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """The freeze is process-wide: leave the test process as it was."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settles_once_per_change_and_interval() -> None:
    now = [100.0]
    engine = Engine()
    s = HeapSettler(engine, interval=30.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert s.settle_if_changed() and gc.get_freeze_count() > 0
    assert not s.settle_if_changed()  # nothing changed
    engine.generation += 1
    now[0] += 10
    assert not s.settle_if_changed()  # changed, but the last pass is 10 s old
    now[0] += 20
    assert s.settle_if_changed()
    assert len(s.passes) == 2 and all(p >= 0 for p in s.passes)


def test_a_replaced_state_is_unfrozen_so_its_cycles_are_freed() -> None:
    now = [0.0]
    engine = Engine()
    s = HeapSettler(engine, interval=1.0, clock=lambda: now[0])  # type: ignore[arg-type]
    old = weakref.ref(engine.state.cycle)
    assert s.settle_if_changed()  # the old state's cycle is frozen now
    engine.state = State()  # a reload: the old state is garbage, in a cycle
    gc.collect()
    assert old() is not None  # frozen: a collection does not see it
    now[0] += 2
    assert s.settle_if_changed()
    assert old() is None  # unfrozen, collected, and the new state frozen
    s.release()
    assert gc.get_freeze_count() == 0


def test_once_settled_what_survives_a_full_pass_is_frozen_and_garbage_is_not() -> None:
    """A full pass of the collector (its own or anyone's) leaves only live objects: the
    settler freezes them, so the next full pass scans only what came after; a cycle that
    was garbage at that pass is collected by it, not frozen; release stops it."""
    engine = Engine()
    s = HeapSettler(engine, interval=0.0, freeze_young=False)  # type: ignore[arg-type]
    gc.collect()
    assert gc.get_freeze_count() == 0  # not settled yet: a full pass freezes nothing
    assert s.settle_if_changed() and s.refrozen == 0
    kept = [Node() for _ in range(1000)]  # long-lived, after the settling pass
    dropped = State()
    gone = weakref.ref(dropped.cycle)
    del dropped  # garbage, in a cycle
    assert all(gc.is_tracked(n) for n in kept)
    frozen = gc.get_freeze_count()
    gc.collect()
    assert s.refrozen == 1 and gone() is None
    assert gc.get_freeze_count() >= frozen + len(kept)
    gc.collect(1)  # a younger pass freezes nothing
    assert s.refrozen == 1
    s.release()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert s.refrozen == 1  # released: no hook any more


@pytest.fixture
def manual_collections() -> Iterator[None]:
    """Collections only where the test asks (the collector's own would land at random)."""
    gc.disable()
    yield
    gc.enable()


def test_once_settled_what_survives_a_young_pass_is_frozen_and_young_garbage_is_not(manual_collections: None) -> None:
    """A young pass collects the young garbage (cycles too), then its survivors are frozen:
    the next young pass scans only what came after, and no older pass is ever due."""
    now = [0.0]
    engine = Engine()
    s = HeapSettler(engine, interval=0.0, clock=lambda: now[0], full_every=60.0)  # type: ignore[arg-type]
    assert s.settle_if_changed()
    kept = [Node() for _ in range(1000)]
    dropped = State()
    gone = weakref.ref(dropped.cycle)
    del dropped  # young garbage, in a cycle
    frozen = gc.get_freeze_count()
    gc.collect(0)
    assert s.young_refrozen == 1 and s.refrozen == 0 and gone() is None
    assert gc.get_freeze_count() >= frozen + len(kept)
    assert gc.get_count()[1:] == (0, 0) and not gc.get_objects(generation=1) and not gc.get_objects(generation=2)
    assert all(gc.is_tracked(n) for n in kept)

    # what was alive in a cycle at a young pass and died after it stays frozen ...
    late = State()
    leaked = weakref.ref(late.cycle)
    gc.collect(0)
    del late
    gc.collect()
    assert leaked() is not None
    assert not s.settle_if_changed()  # nothing changed, and everything was collected 0 s ago
    # ... until the settler collects everything again, `full_every` after the last time
    now[0] += 60.0
    assert s.settle_if_changed() and len(s.passes) == 2
    assert leaked() is None and gc.get_freeze_count() > 0
    s.release()


def test_without_freeze_young_a_young_pass_freezes_nothing(manual_collections: None) -> None:
    s = HeapSettler(Engine(), interval=0.0, freeze_young=False)  # type: ignore[arg-type]
    assert s.settle_if_changed()
    frozen = gc.get_freeze_count()
    kept = [Node() for _ in range(100)]
    gc.collect(0)
    gc.collect(1)
    # (frozen objects freed meanwhile, by another thread of the test process, lower the count: only a freeze raises it)
    assert s.young_refrozen == 0 and gc.get_freeze_count() <= frozen and all(gc.is_tracked(n) for n in kept)
    s.release()


def test_server_settles_its_heap_on_the_refresher_tick_and_releases_it_on_stop(bundle: Bundle) -> None:  # noqa: F811
    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False, settle_heap=True))
    try:
        assert gc.get_freeze_count() == 0
        th.server.refresher.tick()
        assert th.server.heap is not None and len(th.server.heap.passes) == 1 and gc.get_freeze_count() > 0
        th.server.refresher.tick()
        assert len(th.server.heap.passes) == 1  # nothing registered since
    finally:
        th.stop()
    assert gc.get_freeze_count() == 0


def test_after_a_reload_the_old_registry_is_freed_not_frozen(bundle: Bundle) -> None:  # noqa: F811
    """A reload unfreezes, so the previous registry (its groups and tiers reference each
    other) is collected; the request-shape cache, which held the old state, lets it go."""

    from policyc.server.proto import pb, pb_grpc

    th = start(bundle, ServeConfig(cluster=SMALL, start_refresher=False, settle_heap=True))
    try:
        with operator_channel(f"127.0.0.1:{th.server.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            stub.Decide(pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}))
            th.server.refresher.tick()  # settles, with the shape cache holding the state
            old = weakref.ref(th.server.state.registry)
            th.call(th.server.service.reload(bundle))
            assert th.server.heap is not None
            th.server.heap.interval = 0.0  # no wait for the next pass
            th.server.refresher.tick()
            assert len(th.server.heap.passes) == 2
            assert old() is None
            d = stub.Decide(pb.DecideRequest(headers={"X-Tenant": "acme-bank", "X-Model": "fraud-scorer"}))
            assert d.bundle_hash == bundle.content_hash
    finally:
        th.stop()
