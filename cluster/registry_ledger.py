"""Registry writes that can always say what happened to them.

A registration or removal a replica writes carries a request id (the caller's
`x-request-id`, or one the replica makes). The write is one transaction guarded on that
id's record, `requests/<id>`, being absent, and it creates the record as `applied`:

- a retry with the same id never applies twice: the guard fails and the record says what
  the first attempt did (the settled result is returned, no duplicate);
- a write the store did not confirm (quorum lost, the call timed out) is *unknown*, never
  "not done": a member that received it may still commit it when quorum returns. Once the
  store answers again the replica *settles* it by claiming the id: a transaction with the
  same guard that creates the record as `abandoned`. If the claim succeeds, the write never
  landed and now never can (a late copy finds the record and changes nothing); if it fails,
  the record says the write was applied;
- a retry after a write was settled as not applied applies it then (compare-and-swap on
  the `abandoned` record).

Records live under a lease of `REQUEST_TTL` (a new lease every half of it), so a request id
is remembered for between half an hour and an hour.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import dataclass
from enum import Enum

from .keys import Keys
from .store import Delete, FleetStore, Guard, Put, StoreError, StoreUnavailable

REQUEST_TTL = 3600  # seconds a request id's record lives (at least half of it)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class Op(str, Enum):
    REGISTER = "register"
    DEREGISTER = "deregister"


class Outcome(str, Enum):
    APPLIED = "applied"
    NOT_APPLIED = "not applied"


class Unconfirmed(StoreUnavailable):
    """The store did not confirm a write in time: its outcome is unknown until settled."""

    def __init__(self, w: "RegistryWrite", why: str) -> None:
        super().__init__(f"{w.describe()}: not confirmed ({why})")
        self.write = w
        self.why = why


class RequestReused(ValueError):
    """The request id already names a different request."""


def valid_request_id(request_id: str) -> bool:
    """1-128 characters of letters, digits and `. _ : -` (a UUID, Envoy's x-request-id): it
    becomes part of a store key."""
    return bool(_REQUEST_ID.fullmatch(request_id))


@dataclass(frozen=True, slots=True)
class RegistryWrite:
    """One registry write: `value` is the instance record for a registration, empty for a removal."""

    op: Op
    instance_id: str
    request_id: str
    value: bytes = b""

    @property
    def digest(self) -> str:
        h = hashlib.sha256(f"{self.op.value}\0{self.instance_id}\0".encode())
        h.update(self.value)
        return h.hexdigest()

    def describe(self) -> str:
        what = "registration" if self.op is Op.REGISTER else "removal"
        return f"{what} of instance `{self.instance_id}` (request {self.request_id})"


@dataclass(frozen=True, slots=True)
class Record:
    op: str
    instance_id: str
    digest: str
    state: str  # "applied" or "abandoned"
    by: str  # the replica that wrote it
    time: float

    def encode(self) -> bytes:
        return json.dumps({"op": self.op, "instance": self.instance_id, "digest": self.digest, "state": self.state,
                           "by": self.by, "time": self.time}, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, key: str, raw: bytes) -> "Record":
        try:
            b = json.loads(raw)
            return cls(str(b["op"]), str(b["instance"]), str(b["digest"]), str(b["state"]), str(b["by"]), float(b["time"]))
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"{key}: not a request record ({e})") from None

    def settles(self, w: RegistryWrite) -> bool:
        return self.digest == w.digest


class Ledger:
    """The guarded writes and the settling of unconfirmed ones, for one replica."""

    def __init__(self, store: FleetStore, keys: Keys, by: str, ttl: int = REQUEST_TTL) -> None:
        self.store = store
        self.keys = keys
        self.by = by
        self.ttl = ttl
        self._lease = 0
        self._lease_at = 0.0

    async def _records_lease(self) -> int:
        if not self._lease or time.monotonic() - self._lease_at > self.ttl / 2:
            self._lease = await self.store.grant(self.ttl)
            self._lease_at = time.monotonic()
        return self._lease

    def _record(self, w: RegistryWrite, state: str) -> Record:
        return Record(w.op.value, w.instance_id, w.digest, state, self.by, time.time())

    def _op(self, w: RegistryWrite) -> Put | Delete:
        key = self.keys.instance(w.instance_id)
        return Put(key, w.value) if w.op is Op.REGISTER else Delete(key)

    async def apply(self, w: RegistryWrite) -> Outcome:
        """Apply `w` once under its request id: APPLIED (now, or by an earlier attempt of the
        same request). RequestReused when the id names another request; StoreError as the
        store raised it (StoreUnavailable: the outcome is unknown, see `settle`)."""
        rkey = self.keys.request(w.request_id)
        for _ in range(4):
            lease = await self._records_lease()
            ok, _ = await self.store.transact([Guard(rkey, create_revision=0)],
                                              [self._op(w), Put(rkey, self._record(w, "applied").encode(), lease)])
            if ok:
                return Outcome.APPLIED
            got = await self.store.get(rkey)
            if got is None:  # its lease lapsed between the two calls: try again
                continue
            rec = Record.decode(rkey, got.value)
            if not rec.settles(w):
                raise RequestReused(f"request id `{w.request_id}` was used for another request ({rec.op} of instance "
                                    f"`{rec.instance_id}`); give each request its own id")
            if rec.state == "applied":
                return Outcome.APPLIED
            # settled as not applied earlier: this retry applies it now
            ok, _ = await self.store.transact([Guard(rkey, value=got.value)],
                                              [self._op(w), Put(rkey, self._record(w, "applied").encode(), lease)])
            if ok:
                return Outcome.APPLIED
        raise StoreError(f"{w.describe()}: its request record kept changing under it")

    async def settle(self, w: RegistryWrite) -> Outcome:
        """What became of `w`, whose write was not confirmed, decided for good: claim its id
        (the claim and the write exclude each other). StoreError when the store still does
        not answer (try again later)."""
        rkey = self.keys.request(w.request_id)
        for _ in range(4):
            lease = await self._records_lease()
            ok, _ = await self.store.transact([Guard(rkey, create_revision=0)], [Put(rkey, self._record(w, "abandoned").encode(), lease)])
            if ok:
                return Outcome.NOT_APPLIED
            got = await self.store.get(rkey)
            if got is None:
                continue
            rec = Record.decode(rkey, got.value)
            return Outcome.APPLIED if rec.settles(w) and rec.state == "applied" else Outcome.NOT_APPLIED
        raise StoreError(f"{w.describe()}: its request record kept changing under it")

    async def applied_before(self, w: RegistryWrite) -> bool:
        """Whether an earlier attempt of this very request was applied (for a retry that the
        local registry refuses as already done: it gets the settled result)."""
        got = await self.store.get(self.keys.request(w.request_id))
        if got is None:
            return False
        rec = Record.decode(self.keys.request(w.request_id), got.value)
        return rec.settles(w) and rec.state == "applied"
