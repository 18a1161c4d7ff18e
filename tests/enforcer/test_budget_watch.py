"""The budget watch: a crossing's urgent act runs at its deadline — never before it, soon
after it — and before the account; disarmed requests never fire; a clock that stands still
inside the lead time does not hold the interpreter (the wait before a deadline is bounded in real time)."""

from __future__ import annotations

import os
import threading
import time

from policyc.enforcer.budget_watch import LEAD, BudgetWatch


def test_urgent_at_the_deadline_then_the_account_in_order() -> None:
    watch = BudgetWatch()
    urgent: list[tuple[int, float]] = []
    fired: list[int] = []
    done = threading.Semaphore(0)
    now = time.monotonic()
    deadlines = [now + 0.02 + 0.003 * i for i in range(20)]
    for i, d in enumerate(reversed(deadlines)):  # armed out of order
        k = len(deadlines) - 1 - i
        watch.arm(d, lambda _late, k=k: (fired.append(k), done.release()),
                  lambda _late, k=k: urgent.append((k, time.monotonic())))
    for _ in deadlines:
        assert done.acquire(timeout=5)
    watch.close()
    assert [k for k, _ in urgent] == list(range(20)) and fired == list(range(20))
    for k, at in urgent:
        assert at >= deadlines[k], f"request {k} cancelled {1e6 * (deadlines[k] - at):.0f} us before its deadline"
        assert at - deadlines[k] < 0.25  # soon after (generous: a loaded CI machine)


def test_disarmed_never_fires_and_says_so() -> None:
    watch = BudgetWatch()
    ran: list[str] = []
    token = watch.arm(time.monotonic() + 0.01, lambda _: ran.append("fire"), lambda _: ran.append("urgent"))
    assert watch.disarm(token) is True
    assert watch.disarm(token) is False
    time.sleep(0.05)
    watch.close()
    assert ran == []


def test_a_clock_standing_still_in_the_lead_does_not_hold_the_interpreter() -> None:
    stuck = [100.0]
    watch = BudgetWatch(clock=lambda: stuck[0])
    ran = threading.Event()
    watch.arm(100.0 + LEAD / 2, lambda _: ran.set())  # inside the lead time, and the clock never gets there
    t0 = time.monotonic()
    for _ in range(200):  # this thread keeps getting the interpreter: 1 ms naps, not one switch interval each
        time.sleep(0.001)
    assert time.monotonic() - t0 < 0.8  # 200 x 5 ms if the watch kept the interpreter (the switch interval)
    stuck[0] = 101.0  # the clock moves on: the crossing is acted on
    assert ran.wait(timeout=5)
    watch.close()


def test_young_collections_land_between_crossings() -> None:
    import gc

    from policyc.enforcer.budget_watch import GC_ROOM

    watch = BudgetWatch()
    threshold0 = gc.get_threshold()[0]
    seen: list[tuple[str, float, bool]] = []  # thread, start, inside an account
    in_account = threading.local()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append((threading.current_thread().name, time.monotonic(), getattr(in_account, "on", False)))

    def account(_late: float) -> None:
        in_account.on = True
        for _ in range(threshold0 * 2 // 3):  # cycles (only the collector frees them): over half due after
            cycle: list[object] = []  # each account, never the whole threshold within one
            cycle.append(cycle)
        in_account.on = False
        done.release()

    done = threading.Semaphore(0)
    gc.collect()
    now = time.monotonic()
    deadlines = [now + 0.03 + 0.005 * i for i in range(30)]
    gc.callbacks.append(on_gc)
    try:
        for d in deadlines:
            watch.arm(d, account)
        for _ in deadlines:
            assert done.acquire(timeout=5)
    finally:
        gc.callbacks.remove(on_gc)
        watch.close()
    acts = [(t, inside) for name, t, inside in seen if name == "policyc-budget-acts"]
    steered = [t for t, inside in acts if not inside]
    assert len(steered) >= 10, seen
    # an account's garbage tips a collection inside the next one only where the watch fell
    # behind (a deadline already due: the timer needs the interpreter, nothing is run)
    assert len(acts) - len(steered) <= len(steered) // 4, acts
    for t in steered:
        ahead = min((d - t for d in deadlines if d > t), default=1.0)
        assert ahead >= GC_ROOM, f"a collection started {ahead * 1e6:.0f} us before a deadline"


def _cpu_s(thread: threading.Thread) -> float:
    fields = open(f"/proc/self/task/{thread.native_id}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_requests_answered_within_budget_cost_the_timer_nothing() -> None:
    """Most requests finish before their budget: their disarmed deadlines are dropped, never
    waited out in the lead time (300 of them would be 0.12 s of spinning)."""
    watch = BudgetWatch()
    now = time.monotonic()
    tokens = [watch.arm(now + 0.01 + 0.001 * i, lambda _: None, lambda _: None) for i in range(300)]
    before = _cpu_s(watch._thread)
    for token in tokens:
        watch.disarm(token)
    time.sleep(0.4)  # every deadline has passed
    spent = _cpu_s(watch._thread) - before
    watch.close()
    assert spent < 0.05, f"the timer thread spent {spent * 1e3:.0f} ms of CPU on disarmed deadlines"
