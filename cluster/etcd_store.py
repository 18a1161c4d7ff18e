"""`FleetStore` on etcd 3.4, through aetcd (asyncio gRPC).

Several endpoints become one gRPC channel over all of them (`ipv4:a:p,b:q,…`,
pick-first): when the member in use dies, the next call goes to another, so a replica
rides through the loss of an etcd member with no reconnect logic of its own. Calls that
fail while raft elects a leader (UNAVAILABLE, "leader changed", "no leader") are retried
until `op_timeout`; after that `StoreUnavailable` says what the last error was. A request
etcd answered with a refusal (invalid argument, permission) raises `StoreRefused`: only
then is a write known not to have been applied; after `StoreUnavailable` it may still be
committed (`registry_ledger.py` settles which).

aetcd is used for what it does well (connection, get/put/delete, leases, watches); the
transactions and the status calls go to its stubs directly, because its `transaction`
drops the response header, whose revision a fencing token needs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import aetcd
import grpc
from aetcd import rpc

from .store import Change, ChangeKind, Compacted, Delete, Entry, Guard, Put, Snapshot, StoreError, StoreRefused, StoreStatus, StoreUnavailable

T = TypeVar("T")
READ_PAGE = 2000  # keys per Range of `read_prefix` (~0.8 MB of instance records)
_RETRYABLE = (aetcd.ConnectionFailedError, aetcd.ConnectionTimeoutError, aetcd.InternalError)
_TRANSIENT_WORDS = ("leader changed", "no leader", "timed out", "unavailable", "too many requests", "connection")


def parse_endpoints(urls: Sequence[str]) -> list[tuple[str, int]]:
    """`http://127.0.0.1:2379`, `127.0.0.1:2379` or `host:2379` → (host, port); a clear
    ValueError for anything else."""
    out = []
    for url in urls:
        for part in url.split(","):
            raw = part.strip()
            if not raw:
                continue
            hostport = raw.split("://", 1)[1] if "://" in raw else raw
            if raw.startswith("https://"):
                raise ValueError(f"etcd endpoint `{raw}`: TLS to etcd is not supported yet; use a loopback or private network")
            host, sep, port = hostport.rstrip("/").rpartition(":")
            if not sep or not port.isdigit() or not host:
                raise ValueError(f"etcd endpoint `{raw}`: expected HOST:PORT or http://HOST:PORT")
            out.append((host.strip("[]"), int(port)))
    if not out:
        raise ValueError("no etcd endpoint given")
    return out


def _target(endpoints: list[tuple[str, int]]) -> tuple[str, int]:
    """aetcd's (host, port), which it joins as `host:port`, spelling one channel over all
    members when there are several."""
    if len(endpoints) == 1:
        return endpoints[0]
    for h, _ in endpoints:
        try:
            ipaddress.IPv4Address(h)
        except ValueError:
            raise ValueError(f"etcd endpoint `{h}`: several endpoints must be IPv4 addresses (one gRPC channel spans them)") from None
    head = ",".join(f"{h}:{p}" for h, p in endpoints[:-1])
    return f"ipv4:{head},{endpoints[-1][0]}", endpoints[-1][1]


def _transient(e: Exception) -> bool:
    if isinstance(e, _RETRYABLE):
        return True
    return any(w in str(e).lower() for w in _TRANSIENT_WORDS)


_REFUSALS = (aetcd.InvalidArgumentError, aetcd.PreconditionFailedError, aetcd.exceptions.UnauthenticatedError)
_REFUSAL_CODES = ("INVALID_ARGUMENT", "FAILED_PRECONDITION", "PERMISSION_DENIED", "UNAUTHENTICATED")


def _refusal(e: Exception) -> bool:
    """etcd answered and refused (the request was looked at and not applied), as against a
    call that broke or timed out, whose write may still be committed later."""
    if isinstance(e, _REFUSALS):
        return True
    code = getattr(e, "code", None)
    name = getattr(code(), "name", "") if callable(code) else ""
    return name in _REFUSAL_CODES


def _say(e: Exception) -> str:
    """One line for a log or an error message (a gRPC error's repr spans five)."""
    code, details = getattr(e, "code", None), getattr(e, "details", None)
    if callable(code) and callable(details):
        return f"{getattr(code(), 'name', code())}: {details()}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _entry(kv) -> Entry:  # type: ignore[no-untyped-def]
    return Entry(kv.key.decode(), bytes(kv.value), kv.create_revision, kv.mod_revision, kv.lease)


def _range_end(prefix: str) -> bytes:
    b = bytearray(prefix.encode())
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


class EtcdStore:
    def __init__(self, endpoints: Sequence[str], *, op_timeout: float = 5.0, call_timeout: float = 1.0) -> None:
        self._endpoints = parse_endpoints(endpoints)
        self.description = "etcd " + ",".join(f"{h}:{p}" for h, p in self._endpoints)
        self.op_timeout = op_timeout
        host, port = _target(self._endpoints)
        opts = {"grpc.initial_reconnect_backoff_ms": 50, "grpc.min_reconnect_backoff_ms": 50,
                "grpc.max_reconnect_backoff_ms": 500, "grpc.enable_retries": 0}
        self._options = opts
        self._client = aetcd.Client(host=host, port=port, timeout=call_timeout, options=opts)
        self._sync: Any = None  # a plain gRPC channel for `transact_blocking`, made on first use

    async def connect(self) -> None:
        await self._retry("connect", self._client.connect)

    async def close(self) -> None:
        await self._client.close()
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    async def _retry(self, what: str, call: Callable[[], Awaitable[T]], read: bool = False) -> T:
        """`call` again while etcd's failure is transient, until `op_timeout`. A read is
        also tried again after a call deadline (a loaded or just-resumed cluster); a write
        is not: its deadline leaves the outcome unknown, which the caller must settle."""
        deadline = time.monotonic() + self.op_timeout
        pause = 0.02
        while True:
            try:
                return await call()
            except (aetcd.ClientError, rpc.AioRpcError) as e:
                if not (_transient(e) or read and "deadline" in _say(e).lower()):
                    kind = StoreRefused if _refusal(e) else StoreError
                    raise kind(f"{self.description}: {what}: {_say(e)}") from None
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(f"{self.description}: {what} failed for {self.op_timeout:g} s: {_say(e)}") from None
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.25)

    async def get(self, key: str) -> Entry | None:
        got = await self._retry(f"get {key}", lambda: self._client.get(key.encode()), read=True)
        return None if got is None else _entry(got)

    async def read_prefix(self, prefix: str) -> Snapshot:
        """Every key under `prefix` at one revision, read a page at a time: one Range of a
        100,000-instance fleet is ~40 MB, ten times gRPC's 4 MB message limit. Pages are
        read at the first page's revision (one consistent snapshot); a page too large for
        the limit (large records) is read again at half the count."""
        async def call() -> Snapshot:
            c = self._client
            await c.connect()
            end = _range_end(prefix)
            key, revision, limit = prefix.encode(), 0, READ_PAGE
            kvs: list[Any] = []
            while True:
                try:
                    resp = await c.kvstub.Range(rpc.RangeRequest(key=key, range_end=end, limit=limit, revision=revision),
                                                timeout=c._timeout, metadata=c.metadata)
                except grpc.aio.AioRpcError as e:
                    if e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and limit > 1:
                        limit //= 2
                        continue
                    raise
                kvs.extend(resp.kvs)
                revision = revision or resp.header.revision
                if not resp.more or not resp.kvs:
                    return Snapshot(tuple(_entry(kv) for kv in kvs), revision)
                key = resp.kvs[-1].key + b"\0"
        return await self._retry(f"read {prefix}", call, read=True)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        r = await self._retry(f"put {key}", lambda: self._client.put(key.encode(), value, lease=lease or None))
        return int(r.header.revision)

    async def delete(self, key: str) -> int:
        r = await self._retry(f"delete {key}", lambda: self._client.delete(key.encode()))
        return int(r.header.revision) if r is not None else 0

    async def grant(self, ttl: int) -> int:
        lease = await self._retry("grant a lease", lambda: self._client.lease(ttl))
        return int(lease.id)

    async def refresh(self, lease: int) -> int:
        reply = await self._retry(f"keep lease {lease:x} alive", lambda: self._client.refresh_lease(lease))
        return int(reply.TTL) if reply is not None else 0

    async def revoke(self, lease: int) -> None:
        try:
            await self._retry(f"revoke lease {lease:x}", lambda: self._client.revoke_lease(lease))
        except StoreError as e:
            if "not found" not in str(e):
                raise

    async def time_to_live(self, lease: int) -> int | None:
        try:
            info = await self._client.get_lease_info(lease, keys=False)
        except (aetcd.ClientError, rpc.AioRpcError):
            return None
        return int(info.TTL) if info.TTL > 0 else None

    async def transact(self, guards: Sequence[Guard], ops: Sequence[Put | Delete]) -> tuple[bool, int]:
        req = self._txn_request(guards, ops)

        async def call() -> tuple[bool, int]:
            c = self._client
            await c.connect()
            resp = await c.kvstub.Txn(req, timeout=c._timeout, metadata=c.metadata)
            return bool(resp.succeeded), int(resp.header.revision)
        return await self._retry("transaction", call)

    @staticmethod
    def _txn_request(guards: Sequence[Guard], ops: Sequence[Put | Delete]) -> rpc.TxnRequest:
        compare = []
        for g in guards:
            if g.create_revision is not None:
                compare.append(rpc.Compare(key=g.key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.CREATE,
                                           create_revision=g.create_revision))
            if g.value is not None:
                compare.append(rpc.Compare(key=g.key.encode(), result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, value=g.value))
        success = []
        for op in ops:
            if isinstance(op, Put):
                success.append(rpc.RequestOp(request_put=rpc.PutRequest(key=op.key.encode(), value=op.value, lease=op.lease)))
            else:
                success.append(rpc.RequestOp(request_delete_range=rpc.DeleteRangeRequest(key=op.key.encode())))
        return rpc.TxnRequest(compare=compare, success=success)

    def transact_blocking(self, guards: Sequence[Guard], ops: Sequence[Put | Delete], timeout: float) -> tuple[bool, int]:
        """One transaction on a plain (not asyncio) gRPC channel to the same members, so a
        synchronous caller on any thread can wait for it; retried through an election."""
        import grpc

        if self._sync is None:
            host, port = _target(self._endpoints)
            self._sync = grpc.insecure_channel(f"{host}:{port}", options=list(self._options.items()))
        stub = rpc.KVStub(self._sync)
        req = self._txn_request(guards, ops)
        deadline = time.monotonic() + timeout
        pause = 0.02
        while True:
            try:
                resp = stub.Txn(req, timeout=max(0.05, min(1.0, deadline - time.monotonic())))
                return bool(resp.succeeded), int(resp.header.revision)
            except grpc.RpcError as e:
                code = e.code()  # type: ignore[attr-defined]
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) and not _transient(Exception(e.details())):  # type: ignore[attr-defined]
                    kind = StoreRefused if _refusal(e) else StoreError
                    raise kind(f"{self.description}: transaction: {e.details()}") from None  # type: ignore[attr-defined]
                if time.monotonic() + pause > deadline:
                    raise StoreUnavailable(f"{self.description}: transaction failed for {timeout:g} s: {e.details()}") from None  # type: ignore[attr-defined]
            time.sleep(pause)
            pause = min(pause * 2, 0.25)

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[Change]:  # type: ignore[override]
        try:
            await self._client.connect()
            w = await self._client.watch(prefix.encode(), range_end=_range_end(prefix), start_revision=start_revision)
        except aetcd.RevisionCompactedError as e:
            raise Compacted(e.compacted_revision) from None
        except (aetcd.ClientError, rpc.AioRpcError) as e:
            raise StoreUnavailable(f"{self.description}: watch {prefix}: {_say(e)}") from None
        try:
            async for ev in w:
                kind = ChangeKind.PUT if ev.kind == aetcd.EventKind.PUT else ChangeKind.DELETE
                yield Change(kind, ev.kv.key.decode(), bytes(ev.kv.value), ev.kv.mod_revision)
        except aetcd.RevisionCompactedError as e:
            raise Compacted(e.compacted_revision) from None
        except (aetcd.ClientError, rpc.AioRpcError) as e:
            raise StoreUnavailable(f"{self.description}: watch {prefix} broke: {_say(e)}") from None
        finally:
            try:
                await w.cancel()
            except Exception:  # noqa: BLE001 - the stream may already be gone
                pass
        raise StoreUnavailable(f"{self.description}: watch {prefix} ended")

    async def compact(self, revision: int) -> None:
        """Drop history before `revision` (what an operator's auto-compaction does)."""
        await self._retry("compact", lambda: self._client.compact(revision, physical=True))

    async def status(self) -> list[StoreStatus]:
        """One line per member, asked directly (not through the shared channel)."""
        out = []
        for host, port in self._endpoints:
            c = aetcd.Client(host=host, port=port, timeout=1)
            try:
                await c.connect()
                r = await c.maintenancestub.Status(rpc.StatusRequest(), timeout=1)
                out.append(StoreStatus(f"{host}:{port}", f"{r.leader:x}" if r.leader != r.header.member_id else "self",
                                       int(r.header.revision), int(r.raftTerm)))
            except (aetcd.ClientError, rpc.AioRpcError, OSError) as e:
                out.append(StoreStatus(f"{host}:{port}", f"unreachable ({type(e).__name__})", -1, -1))
            finally:
                await c.close()
        return out
