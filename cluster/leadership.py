"""One actor for dangerous acts: an elected leader, and a fence that its acts pass.

Election is etcd's own recipe: create the leader key if it is absent, under the
candidate's lease (one transaction), so the key — and the leadership — lapse with the
lease when the leader stops answering. The key's create revision is the leader's
**fencing token**: every act (a self-heal step, a quarantine) is written to the store in
a transaction that holds only while the leader key still has that create revision and
that value, so a deposed leader (paused past its TTL, partitioned, slow) cannot act even
if it still believes it leads. The token is written in the act's audit record.
"""

from __future__ import annotations

import itertools
import json
import logging
import time
from dataclasses import dataclass
from typing import Callable

from .keys import Keys
from .store import Change, ChangeKind, FleetStore, Guard, Put, StoreError

log = logging.getLogger("policyc.cluster")


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    token: int
    detail: str


class Election:
    def __init__(self, store: FleetStore, keys: Keys, name: str, lease: Callable[[], int]) -> None:
        self.store = store
        self.keys = keys
        self.name = name
        self._lease = lease
        self.token = 0  # our fencing token while we believe we lead; 0 otherwise
        self.leader = ""  # who leads, as last seen
        self.leader_token = 0
        self.became_leader_at: float | None = None
        self._acts = itertools.count(1)

    async def campaign(self) -> bool:
        """Try once to become leader; True if we are."""
        ok, rev = await self.store.transact([Guard(self.keys.leader, create_revision=0)],
                                            [Put(self.keys.leader, self.name.encode(), self._lease())])
        if ok:
            self._lead(rev)
            return True
        cur = await self.store.get(self.keys.leader)
        if cur is None:
            return False
        self.leader, self.leader_token = cur.value.decode(), cur.create_revision
        if self.leader == self.name and cur.lease == self._lease():  # our own earlier try, whose reply was lost
            self._lead(cur.create_revision)
            return True
        self.token = 0
        return False

    def _lead(self, token: int) -> None:
        if self.token != token:
            log.warning("replica %s leads (fencing token %d)", self.name, token)
            self.became_leader_at = time.monotonic()
        self.token = self.leader_token = token
        self.leader = self.name

    def on_change(self, ch: Change) -> bool:
        """Follow the leader key; True when it is vacant (time to campaign)."""
        if ch.kind is ChangeKind.DELETE:
            self.leader, self.leader_token, self.token = "", 0, 0
            return True
        self.leader, self.leader_token = ch.value.decode(), ch.revision
        if self.leader != self.name:
            self.token = 0
        return False

    def fenced_now(self, kind: str, target: str, detail: str, extra: list[Put], timeout: float) -> Verdict:
        """Record an act under our fencing token, if it still holds: one blocking etcd
        transaction (from whichever thread acts, the serving loop's included)."""
        token = self.token
        if token == 0:
            return Verdict(False, 0, f"replica {self.name} is not the leader ({self.leader or 'no one'} leads); the leader acts")
        record = json.dumps({"kind": kind, "target": target, "detail": detail, "by": self.name, "token": token,
                             "time": time.time()}).encode()
        try:
            ok, _ = self.store.transact_blocking([Guard(self.keys.leader, create_revision=token, value=self.name.encode())],
                                                 [Put(self.keys.act(token, next(self._acts)), record), *extra], timeout)
        except StoreError as e:
            return Verdict(False, token, f"leadership could not be confirmed (fencing token {token}): {e}")
        if not ok:
            if self.token == token:
                self.token = 0
            return Verdict(False, token, f"fencing token {token} no longer holds: replica {self.name} was deposed")
        return Verdict(True, token, f"fencing token {token}")
