"""Soft state every replica must agree on: which instance a session stays on, and which
backends are quarantined until when. Per-tick scores are not here: each replica computes
its own from telemetry.

Each replica keeps a mirror (a dict) that the store's watch fills, so reading it on the
decision path is a dictionary lookup; a write goes to the store in the background
(`submit`), so a request never waits on the store, and an etcd election delays a
session's publication, never its decision. Expiry is in the value (wall-clock seconds),
so every replica ignores an expired entry on its own; the leader deletes them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from .keys import Keys
from .store import Change, ChangeKind, Entry, Put

Submit = Callable[[Put], None]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Affinity:
    instance_id: str
    expires: float


@dataclass(frozen=True, slots=True)
class QuarantineEntry:
    backend: str
    backup: str
    until: float
    rule: str
    by: str  # the replica (the leader) that decided it
    token: int  # its fencing token


class _Mirror(Generic[T]):
    """A dict mirroring one key prefix of the store, filled by a load and the watch. A value
    this version cannot read is skipped, never fatal (a newer replica may have written it)."""

    def __init__(self, keys: Keys, prefix: str, clock: Callable[[], float]) -> None:
        self.keys = keys
        self._prefix = prefix
        self._clock = clock
        self._map: dict[str, T] = {}

    def _decode(self, name: str, body: dict) -> T:  # type: ignore[type-arg]
        raise NotImplementedError

    def load(self, entries: tuple[Entry, ...]) -> None:
        self._map = {}
        for e in entries:
            self._put(e.key, e.value)

    def on_change(self, ch: Change) -> None:
        if ch.kind is ChangeKind.DELETE:
            self._map.pop(self.keys.id_of(ch.key, self._prefix), None)
        else:
            self._put(ch.key, ch.value)

    def _put(self, key: str, value: bytes) -> None:
        name = self.keys.id_of(key, self._prefix)
        try:
            self._map[name] = self._decode(name, json.loads(value))
        except (ValueError, KeyError, TypeError):
            pass

    def __len__(self) -> int:
        return len(self._map)


class SessionBook(_Mirror[Affinity]):
    def __init__(self, keys: Keys, ttl: float, submit: Submit, clock: Callable[[], float] = time.time) -> None:
        super().__init__(keys, keys.sessions, clock)
        self.ttl = ttl
        self._submit = submit

    def _decode(self, name: str, body: dict) -> Affinity:  # type: ignore[type-arg]
        return Affinity(str(body["instance"]), float(body["expires"]))

    def instance_of(self, session: str) -> str | None:
        a = self._map.get(session)
        return a.instance_id if a is not None and a.expires > self._clock() else None

    def keep(self, session: str, instance_id: str) -> None:
        """The session is on `instance_id` now: publish it when it changed or when its
        expiry needs moving (at most once per tenth of the TTL per session)."""
        now = self._clock()
        a = self._map.get(session)
        if a is not None and a.instance_id == instance_id and a.expires - now > self.ttl * 0.9:
            return
        a = Affinity(instance_id, now + self.ttl)
        self._map[session] = a
        self._submit(Put(self.keys.session(session), json.dumps({"instance": a.instance_id, "expires": a.expires}).encode()))

    def expired(self) -> list[str]:
        now = self._clock()
        return [s for s, a in self._map.items() if a.expires <= now]


class QuarantineBoard(_Mirror[QuarantineEntry]):
    """The quarantines in force, fleet-wide (written by the leader in its fenced act)."""

    def __init__(self, keys: Keys, clock: Callable[[], float] = time.time) -> None:
        super().__init__(keys, keys.quarantines, clock)

    def _decode(self, name: str, body: dict) -> QuarantineEntry:  # type: ignore[type-arg]
        return QuarantineEntry(name, str(body["backup"]), float(body["until"]), str(body["rule"]), str(body["by"]),
                               int(body["token"]))

    @staticmethod
    def encode(q: QuarantineEntry) -> bytes:
        return json.dumps({"backup": q.backup, "until": q.until, "rule": q.rule, "by": q.by, "token": q.token}).encode()

    def get(self, backend: str) -> QuarantineEntry | None:
        return self._map.get(backend)

    def active(self) -> list[QuarantineEntry]:
        now = self._clock()
        return sorted((q for q in self._map.values() if q.until > now), key=lambda q: q.backend)

    def expired(self) -> list[str]:
        now = self._clock()
        return [b for b, q in self._map.items() if q.until <= now]
