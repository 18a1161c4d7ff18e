"""`FleetStore` for the embedded default: one process, state in a JSON-lines file.

Without `--etcd`, `policyc serve` keeps its registry here so that a restart does not lose
the fleet. The semantics are etcd's, on one machine: revisions, leases (which die with
the process: a key held by a lease is never written to disk), prefix reads, watches
from a revision (recent history in memory; older asks for a reload, as a compaction
would), guarded transactions. Durable keys are appended to `store.jsonl` and the file is
rewritten compactly on open. A lock file keeps two servers off one state directory.

What it gives up against etcd: no other process sees it (one replica only), and the file
is only as durable as the disk under it (each write is flushed, not fsynced).
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import json
import os
import threading
import time
from pathlib import Path
from typing import IO, AsyncIterator, Sequence

from .store import Change, ChangeKind, Compacted, Delete, Entry, Guard, Put, Snapshot, StoreError, StoreStatus

HISTORY = 10_000  # changes kept for watches that resume; older is "compacted"


class StateDirBusy(StoreError):
    pass


class LocalStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = Path(state_dir)
        self.description = f"local store {self.dir}"
        self._kv: dict[str, Entry] = {}
        self._rev = 1
        self._history: list[Change] = []
        self._leases: dict[int, tuple[int, float]] = {}  # id → (ttl, expires at, monotonic)
        self._next_lease = 1
        self._watchers: list[tuple[str, asyncio.Queue[Change | None]]] = []
        self._file: IO[str] | None = None
        self._lock: IO[str] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # everything runs there; other threads hand over
        self._loop_thread: int | None = None

    # ------------------------------------------------------------------ lifecycle
    async def connect(self) -> None:
        if self._file is not None:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            lock = open(self.dir / "lock", "a+")
        except OSError as e:
            raise StoreError(f"{self.dir}: cannot use the state directory: {e.strerror}") from None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            who = lock.read().strip() or "another process"
            lock.close()
            raise StateDirBusy(f"{self.dir}: the state directory is in use by {who}; give another --state-dir") from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}\n")
        lock.flush()
        self._lock = lock
        self._load()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._sweeper = self._loop.create_task(self._sweep())

    def _load(self) -> None:
        path = self.dir / "store.jsonl"
        if path.exists():
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    key, rev = rec["key"], int(rec["rev"])
                    if rec["op"] == "put":
                        prev = self._kv.get(key)
                        created = prev.create_revision if prev is not None else int(rec.get("created", rev))
                        self._kv[key] = Entry(key, base64.b64decode(rec["value"]), created, rev, 0)
                    else:
                        self._kv.pop(key, None)
                    self._rev = max(self._rev, rev)
                except (ValueError, KeyError, TypeError):
                    if n == len(path.read_text(encoding="utf-8").splitlines()):
                        break  # a torn last line (a crash mid-write): the write never completed
                    raise StoreError(f"{path}:{n}: not a store record") from None
        tmp = self.dir / "store.jsonl.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for e in self._kv.values():
                f.write(self._line("put", e.key, e.value, e.mod_revision, e.create_revision))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._file = open(path, "a", encoding="utf-8")

    @staticmethod
    def _line(op: str, key: str, value: bytes, rev: int, created: int) -> str:
        return json.dumps({"op": op, "key": key, "value": base64.b64encode(value).decode(), "rev": rev,
                           "created": created}, separators=(",", ":")) + "\n"

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for _, q in self._watchers:
            q.put_nowait(None)
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ------------------------------------------------------------------ writes
    def _apply(self, op: Put | Delete, rev: int) -> None:
        if isinstance(op, Put):
            prev = self._kv.get(op.key)
            self._kv[op.key] = Entry(op.key, op.value, prev.create_revision if prev else rev, rev, op.lease)
            ch = Change(ChangeKind.PUT, op.key, op.value, rev)
            if op.lease == 0 and self._file is not None:
                self._file.write(self._line("put", op.key, op.value, rev, self._kv[op.key].create_revision))
                self._file.flush()
            elif prev is not None and prev.lease == 0 and self._file is not None:  # now leased: not durable any more
                self._file.write(self._line("delete", op.key, b"", rev, 0))
                self._file.flush()
        else:
            prev = self._kv.pop(op.key, None)
            if prev is None:
                return
            ch = Change(ChangeKind.DELETE, op.key, b"", rev)
            if prev.lease == 0 and self._file is not None:
                self._file.write(self._line("delete", op.key, b"", rev, 0))
                self._file.flush()
        self._history.append(ch)
        if len(self._history) > HISTORY:
            del self._history[: len(self._history) - HISTORY]
        for prefix, q in self._watchers:
            if ch.key.startswith(prefix):
                q.put_nowait(ch)

    def _check_lease(self, lease: int) -> None:
        if lease and lease not in self._leases:
            raise StoreError(f"{self.description}: lease {lease:x} not found (it lapsed or was revoked)")

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        self._check_lease(lease)
        self._rev += 1
        self._apply(Put(key, value, lease), self._rev)
        return self._rev

    async def delete(self, key: str) -> int:
        if key in self._kv:
            self._rev += 1
            self._apply(Delete(key), self._rev)
        return self._rev

    async def transact(self, guards: Sequence[Guard], ops: Sequence[Put | Delete]) -> tuple[bool, int]:
        return self._transact_now(guards, ops)

    def transact_blocking(self, guards: Sequence[Guard], ops: Sequence[Put | Delete], timeout: float) -> tuple[bool, int]:
        if self._loop is None or threading.get_ident() == self._loop_thread:
            return self._transact_now(guards, ops)
        return asyncio.run_coroutine_threadsafe(self.transact(guards, ops), self._loop).result(timeout)

    def _transact_now(self, guards: Sequence[Guard], ops: Sequence[Put | Delete]) -> tuple[bool, int]:
        for g in guards:
            e = self._kv.get(g.key)
            if g.create_revision is not None and (e.create_revision if e else 0) != g.create_revision:
                return False, self._rev
            if g.value is not None and (e is None or e.value != g.value):
                return False, self._rev
        for op in ops:
            if isinstance(op, Put):
                self._check_lease(op.lease)
        self._rev += 1
        for op in ops:
            self._apply(op, self._rev)
        return True, self._rev

    # ------------------------------------------------------------------ leases
    async def grant(self, ttl: int) -> int:
        lid = self._next_lease
        self._next_lease += 1
        self._leases[lid] = (ttl, time.monotonic() + ttl)
        return lid

    async def refresh(self, lease: int) -> int:
        got = self._leases.get(lease)
        if got is None:
            return 0
        self._leases[lease] = (got[0], time.monotonic() + got[0])
        return got[0]

    async def revoke(self, lease: int) -> None:
        if self._leases.pop(lease, None) is not None:
            self._drop_keys_of(lease)

    async def time_to_live(self, lease: int) -> int | None:
        got = self._leases.get(lease)
        return None if got is None else max(0, int(got[1] - time.monotonic()))

    def _drop_keys_of(self, lease: int) -> None:
        doomed = [k for k, e in self._kv.items() if e.lease == lease]
        if doomed:
            self._rev += 1
            for k in doomed:
                self._apply(Delete(k), self._rev)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            now = time.monotonic()
            for lid, (_, until) in list(self._leases.items()):
                if until <= now:
                    del self._leases[lid]
                    self._drop_keys_of(lid)

    # ------------------------------------------------------------------ reads
    async def get(self, key: str) -> Entry | None:
        return self._kv.get(key)

    async def read_prefix(self, prefix: str) -> Snapshot:
        return Snapshot(tuple(e for k, e in sorted(self._kv.items()) if k.startswith(prefix)), self._rev)

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:  # type: ignore[override]
        q: asyncio.Queue[Change | None] = asyncio.Queue()
        oldest = self._history[0].revision if self._history else self._rev + 1
        if start_revision < oldest and start_revision <= self._rev and self._history_gap(start_revision):
            raise Compacted(oldest - 1)
        for ch in self._history:
            if ch.revision >= start_revision and ch.key.startswith(prefix):
                q.put_nowait(ch)
        entry = (prefix, q)
        self._watchers.append(entry)
        try:
            while True:
                got = await q.get()
                if got is None:
                    return
                yield got
        finally:
            self._watchers.remove(entry)

    def _history_gap(self, start_revision: int) -> bool:
        """True when changes at or after `start_revision` are no longer all kept."""
        return len(self._history) >= HISTORY or (start_revision <= self._rev and not self._history and start_revision < self._rev)

    async def status(self) -> list[StoreStatus]:
        return [StoreStatus(str(self.dir), "local", self._rev, 0)]
