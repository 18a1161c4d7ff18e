"""Fires a callback when a request crosses its budget, on one timer thread for all requests.

A heap of deadlines and a condition variable: arming and disarming are O(log n), and the
thread wakes only for the earliest deadline, so thousands of in-flight requests cost one
sleeping thread rather than one timer each.

Breaking a stream must happen within a millisecond of its crossing, but what a break does
besides (audit records, a redirect, a quarantine, an anomaly report) takes longer, and
with a hundred requests in flight their deadlines come close together: done in one
thread, each crossing waited for every earlier one's whole account (p99 12-21 ms). So an
armed request may carry an `urgent` callback (cancelling its stream: tens of
microseconds), which the timer thread runs at the crossing, for every request due at
once, before anything else; the `fire` callbacks (the rest of the account) run in order
on a second thread.

What makes a crossing late is the interpreter lock, not the clock: a woken thread must
take the lock before it can cancel, and whoever holds it (another thread of the process,
perhaps itself preempted by other processes) lets go when it blocks, or after the switch
interval. So the timer wakes `LEAD` seconds before a deadline (where it takes the lock,
a real-time thread with no timer slack where the process may), then keeps the lock and
watches the clock until the deadline, releasing it for nothing: a late take lands in the
lead, not on the crossing. That costs at most `LEAD` of one CPU per crossing, only when
budgets are crossed. A crossing less than two leads after the one just acted on is spun
through from there rather than waited for: a wait of a few tens of microseconds lets go of
the interpreter all the same, and taking it back was measured at up to 1.7 ms under load. The follow-up thread, for its part, waits out a deadline nearer than
`QUIET` before it starts an account (once, and only with no other account waiting: a
backlog drains at once, or the redirects in it would wait a crossing each), so its own
work is not what the timer waits behind. The cyclic garbage collector is the other
holder worth steering: a collection keeps the lock to its end (1-5 ms for the young
generations on a loaded machine, in whichever thread allocated the object that tipped the
count), so after each account the follow-up thread runs the young collection itself once
it is half due and no deadline is within `GC_ROOM`, and the collections land between
crossings rather than on one. What is left is the lock held by a thread the kernel
preempted for another process: on a machine loaded past its cores, the tail.

The slow acts of a break that nothing waits on at its crossing (a quarantine: the
backup's book, the kernel map update, its audit, the socket walk that follows) are
`defer`red: they run on the follow-up thread after every account waiting, and only where
no crossing is within `ROOM`, so that a quarantine is never the lock holder a crossing
waits for (done inside the account, a burst's first quarantine ran between its later
crossings). Each account, too, starts only with no crossing within `QUIET`, so a burst's
crossings (a slow backend's breaks, a few hundred microseconds apart) are all cancelled
before its accounts are written, unless it is `ACCOUNT_MOST` past its own crossing: a
backlog then drains at once, as the redirects in it must not wait a crossing each.
Deferred work waiting longer than `DEFER_MOST` runs anyway: a deadline every few hundred
microseconds leaves no room, and the quarantine must still happen. None of this (accounts,
deferred work, the steered collection, a connection ender's socket walk) starts while the
timer thread is acting on a crossing, from its lead to its burst's last cancel (`_calm`
clear; the waiters sleep on it): the crossing's entries are off the heap by then, so "no
deadline near" would read as room, and a cancel waiting on gRPC's channel lock lets go of
the interpreter to whoever wants it. (The follow-up thread stays an ordinary thread:
made real-time too, it woke into the timer's cancels, and crossings measured later, not
sooner.)
"""

from __future__ import annotations

import ctypes
import gc
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

LEAD = 0.0004  # seconds before a deadline the timer thread wakes, takes the interpreter and holds it to the crossing
QUIET = 0.001  # the follow-up thread waits out deadlines nearer than this before an account (up to ACCOUNT_MOST)
GC_ROOM = 0.0012  # the follow-up thread runs a due young collection only with no deadline nearer than this
ROOM = 0.001  # deferred work runs only with no deadline nearer than this (or once it has waited DEFER_MOST)
DEFER_MOST = 0.005  # seconds deferred work may wait for room before it runs whatever is near (a quarantine waits no longer)
ACCOUNT_MOST = 0.005  # seconds after its crossing beyond which an account no longer waits for QUIET
PR_SET_TIMERSLACK = 29
log = logging.getLogger(__name__)
_Account = tuple[Callable[[float], None], float]  # (fire, deadline)
_NUDGE = object()  # on the accounts' queue: deferred work arrived


def _prompt_thread() -> None:
    """Ask the kernel to run this thread as soon as it wakes (SCHED_FIFO, the lowest
    real-time priority) where the process may (root or CAP_SYS_NICE): on a loaded machine a
    woken normal thread waits for a CPU behind every other runnable task, which is most of
    a late crossing. The thread sleeps between deadlines, so it takes the CPU only for the
    moments it acts (at most `LEAD` and the cancels per crossing). Elsewhere it stays an
    ordinary thread."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # 0: this thread (Linux)
    except (AttributeError, OSError):
        log.debug("budget watch: no real-time scheduling here; an ordinary thread")
    try:  # the kernel may otherwise defer this thread's timed waits by up to 50 us to batch wake-ups
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (AttributeError, OSError):
        log.debug("budget watch: timer slack unchanged")


class BudgetWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, tuple[Callable[[float], None], Callable[[float], None] | None]] = {}
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._stopped = False
        self._later: queue.SimpleQueue[_Account | object | None] = queue.SimpleQueue()  # accounts, _NUDGE, None: stop
        self._deferred: deque[tuple[Callable[[], None], float]] = deque()  # (work, when deferred: real time)
        self._calm = threading.Event()  # clear while the timer thread acts on a crossing (its lead time to its last cancel)
        self._calm.set()
        self._thread = threading.Thread(target=self._run, name="policyc-budget", daemon=True)
        self._after = threading.Thread(target=self._follow_up, name="policyc-budget-acts", daemon=True)
        self._thread.start()
        self._after.start()

    def arm(self, deadline: float, fire: Callable[[float], None], urgent: Callable[[float], None] | None = None) -> int:
        """Once the clock passes `deadline`: `urgent(lateness_s)` at once on the timer thread
        (keep it short: it delays the next crossing), then `fire(lateness_s)` on the
        follow-up thread. Returns a token."""
        token = next(self._ids)
        with self._cv:
            self._armed[token] = (fire, urgent)
            heapq.heappush(self._heap, (deadline, token))
            if self._heap[0][1] == token:
                self._cv.notify()
        return token

    def disarm(self, token: int) -> bool:
        """True if the callbacks had not run yet (they now never will)."""
        with self._cv:
            return self._armed.pop(token, None) is not None

    def next_deadline(self) -> float | None:
        """The earliest armed deadline (a disarmed one may still be counted), None if none."""
        heap = self._heap
        return heap[0][0] if heap else None

    def defer(self, work: Callable[[], None]) -> None:
        """Run `work()` on the follow-up thread once no account is waiting and no crossing is
        within `ROOM` (or once it has waited `DEFER_MOST`), in the order deferred: for a
        break's acts that nothing waits on at the crossing. Still run at `close`."""
        self._deferred.append((work, time.monotonic()))
        self._later.put(_NUDGE)  # a follow-up thread blocked for accounts: look at the deferred work

    def room_ahead(self, room: float) -> float:
        """Seconds to wait for `room` seconds free of crossings: 0 if the next deadline is at
        least `room` away (or none is armed), else until just past it (its cancels take the
        interpreter first)."""
        nearest = self.next_deadline()
        if nearest is None:
            return 0.0
        ahead = nearest - self._clock()
        return 0.0 if ahead >= room else max(ahead, 0.0) + LEAD / 2

    def wait_for_room(self, room: float, most: float = DEFER_MOST) -> None:
        """Return once no crossing is within `room` seconds, or after `most` seconds whatever
        is near: for another thread's work that would hold the interpreter (ending a
        quarantined backend's connections), so that it starts between crossings."""
        give_up = time.monotonic() + most
        while (left := give_up - time.monotonic()) > 0:
            if not self._calm.is_set():  # the timer thread is acting on a crossing
                self._calm.wait(left)
            elif (pause := self.room_ahead(room)) > 0:
                time.sleep(min(pause, left))
            else:
                return

    def _run(self) -> None:
        _prompt_thread()
        clock, calm = self._clock, self._calm
        while True:
            with self._cv:
                heap, pending = self._heap, self._armed
                while not self._stopped:
                    while heap and heap[0][1] not in pending:  # finished within budget (disarmed): nothing to wait for
                        heapq.heappop(heap)
                    if not heap:
                        calm.set()
                        self._cv.wait()
                        continue
                    left = heap[0][0] - clock()
                    if pending[heap[0][1]][1] is None:  # no stream to cancel: the account can wait for an ordinary wake
                        if left <= 0:
                            break
                        calm.set()
                        self._cv.wait(left)
                        continue
                    if left <= 2 * LEAD:  # within a lead of the lead (a burst's next crossing): spun through, still not calm
                        break
                    calm.set()
                    self._cv.wait(left - LEAD)
                if self._stopped:
                    calm.set()
                    self._later.put(None)
                    return
                due_at = self._heap[0][0]
                calm.clear()
            give_up = time.monotonic() + max(due_at - clock(), 0.0) + LEAD  # bounded in real time, whatever clock the watch reads
            while clock() < due_at and time.monotonic() < give_up:  # the lead time before the deadline: holding the interpreter
                pass
            with self._cv:
                now = clock()
                if now < due_at:  # a clock slower than real time (a test's): wait as for any deadline
                    calm.set()
                    self._cv.wait(0.01)
                    continue
                due: list[tuple[float, Callable[[float], None], Callable[[float], None] | None]] = []
                while self._heap and self._heap[0][0] <= now:
                    deadline, token = heapq.heappop(self._heap)
                    armed = self._armed.pop(token, None)
                    if armed is not None:
                        due.append((deadline, armed[0], armed[1]))
            for deadline, _, urgent in due:  # every stream due now is broken before any account is written
                if urgent is not None:
                    try:
                        urgent(clock() - deadline)
                    except Exception:  # noqa: BLE001 - one request's failure must not stop the watch
                        log.exception("a budget's urgent act failed")
            for deadline, fire, _ in due:
                self._later.put((fire, deadline))

    def _follow_up(self) -> None:
        clock = self._clock
        deferred = self._deferred
        held: _Account | None = None  # the next account, taken from the queue
        taken = 0.0  # when (real time) `held` was taken
        while True:
            if held is None:
                got: _Account | object | None
                if not deferred:
                    got = self._later.get()
                elif self._overdue():
                    self._run_deferred()
                    continue
                elif not self._calm.is_set():  # the timer thread is acting on a crossing: off the interpreter till it is done
                    self._calm.wait(max(DEFER_MOST - (time.monotonic() - deferred[0][1]), 0.0))
                    continue
                else:  # accounts first; the deferred work once none is waiting and there is room
                    pause = self.room_ahead(ROOM)
                    try:
                        got = self._later.get_nowait() if pause == 0 else self._later.get(timeout=pause)
                    except queue.Empty:
                        if pause == 0:
                            self._run_deferred()
                        continue
                if got is _NUDGE:
                    continue
                if got is None:
                    while deferred:  # closing: the deferred acts still happen
                        self._run_deferred()
                    return
                assert isinstance(got, tuple)
                held, taken = got, time.monotonic()
            fire, deadline = held
            if (left := ACCOUNT_MOST - max(clock() - deadline, time.monotonic() - taken)) > 0:
                if not self._calm.is_set():  # a crossing being acted on: wait for its last cancel
                    self._calm.wait(left)
                    continue
                if (pause := self.room_ahead(QUIET)) > 0:
                    time.sleep(min(pause, left))  # to just after that crossing: off the interpreter meanwhile
                    continue
            held = None
            try:
                fire(clock() - deadline)  # lateness now: what the account reports, crossing to act
            except Exception:  # noqa: BLE001 - as above
                log.exception("a budget's callback failed")
            self._collect_between()
            time.sleep(0)  # let go of the interpreter between accounts: a timer thread waking for a crossing takes it

    def _overdue(self) -> bool:
        deferred = self._deferred
        return bool(deferred) and time.monotonic() - deferred[0][1] >= DEFER_MOST

    def _run_deferred(self) -> None:
        work, _ = self._deferred.popleft()
        try:
            work()
        except Exception:  # noqa: BLE001 - one request's failure must not stop the watch
            log.exception("a budget's deferred act failed")
        self._collect_between()
        time.sleep(0)

    def _collect_between(self) -> None:
        """The young collection (generation 0, or 1 when that one is due too) now, if it is
        at least half due and no deadline is within `GC_ROOM`: so the collector does not
        start in another thread at a crossing. When the oldest generation may be due, the
        interpreter's own collection is let happen (it alone knows whether a full one is
        worth it), so a long storm of breaks cannot keep old garbage from being freed.
        Left alone where the program turned the collector off."""
        count0, count1, count2 = gc.get_count()
        threshold0, threshold1, threshold2 = gc.get_threshold()
        if not gc.isenabled() or threshold0 <= 0 or count0 < threshold0 // 2:
            return
        gen1_due = count1 + 1 >= threshold1
        if gen1_due and count2 + 1 > threshold2:
            return  # the oldest generation may be due: the interpreter's own rule decides that one
        nearest = self.next_deadline()
        if not self._calm.is_set() or nearest is not None and nearest - self._clock() < GC_ROOM:
            return
        gc.collect(1 if gen1_due else 0)

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        self._thread.join(timeout=1)
        self._after.join(timeout=1)
