"""What a replica needs from a shared store, as one interface: etcd (`EtcdStore`) and the
embedded default's local file (`LocalStore`) both implement it, so the rest of
`policyc.cluster` never knows which one it talks to.

The interface is etcd's own model, kept small: keys with revisions, leases that delete
their keys when they lapse, a prefix read that says at which revision it was taken, a
watch that resumes from a revision (or says that revision was compacted away), and
transactions guarded by a key's create revision (leadership, fencing) or value
(compare-and-swap of the bundle in force).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import AsyncIterator, Protocol, Sequence


class StoreError(Exception):
    """The store could not be reached or refused the request; the message says which and why."""


class StoreUnavailable(StoreError):
    """No member answered in time (a partition, an election, a store that is down). For a
    write this says nothing about whether it took effect: a request a member received and
    could not commit (no quorum) may still be committed when quorum returns."""


class StoreRefused(StoreError):
    """The store answered and refused the request (an invalid argument, a permission): a
    write refused so was not applied, and retrying it unchanged will not help."""


class Compacted(StoreError):
    """A watch asked for history the store has compacted away: reload the prefix."""

    def __init__(self, revision: int) -> None:
        super().__init__(f"revision {revision} was compacted away")
        self.revision = revision


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int  # 0: held by no lease


class ChangeKind(str, Enum):
    PUT = "put"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Change:
    kind: ChangeKind
    key: str
    value: bytes  # empty for a delete
    revision: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    entries: tuple[Entry, ...]
    revision: int  # the store's revision the read was taken at: a watch resumes after it


@dataclass(frozen=True, slots=True)
class Guard:
    """A transaction's condition on one key: its create revision equals `create_revision`
    (0: the key is absent), and, when `value` is given, its value equals it."""

    key: str
    create_revision: int | None = None
    value: bytes | None = None


@dataclass(frozen=True, slots=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Delete:
    key: str


@dataclass(frozen=True, slots=True)
class StoreStatus:
    endpoint: str
    leader: str  # which member leads (etcd: member id in hex; local: "local")
    revision: int
    raft_term: int


class FleetStore(Protocol):
    """The shared store of a policyc cluster (see the module docstring)."""

    description: str

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def get(self, key: str) -> Entry | None: ...

    async def read_prefix(self, prefix: str) -> Snapshot: ...

    async def put(self, key: str, value: bytes, lease: int = 0) -> int: ...

    async def delete(self, key: str) -> int: ...

    async def grant(self, ttl: int) -> int: ...

    async def refresh(self, lease: int) -> int:
        """Keep `lease` alive; returns the TTL left (0 or less: it has lapsed)."""
        ...

    async def revoke(self, lease: int) -> None: ...

    async def time_to_live(self, lease: int) -> int | None:
        """Seconds the lease has left (None: unknown, or it has lapsed)."""
        ...

    async def transact(self, guards: Sequence[Guard], ops: Sequence[Put | Delete]) -> tuple[bool, int]:
        """Apply `ops` when every guard holds: (applied, revision)."""
        ...

    def transact_blocking(self, guards: Sequence[Guard], ops: Sequence[Put | Delete], timeout: float) -> tuple[bool, int]:
        """`transact`, waited for by the calling thread (any thread, the event loop's
        included): for the fence, whose callers are synchronous."""
        ...

    def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:
        """Changes under `prefix` from `start_revision` on (inclusive), in order; raises
        `Compacted` when that history is gone and `StoreUnavailable` when the stream broke."""
        ...

    async def status(self) -> list[StoreStatus]: ...
