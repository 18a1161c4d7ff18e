"""The audit writer process: everything after "a record was handed over" happens here.

`AuditLog` starts it (`python -m policyc.audit.writer_process ACK_FD`) with the records
pipe on stdin and the log's lock file inherited, so the lock is held until *both* have
exited: a second writer can never start while this one may still commit. Each read of the
pipe takes whatever arrived while the previous batch was being committed (group commit);
the batch is serialised where needed (drafts), its index columns derived (store v2:
`index_columns`; a body that is not JSON is refused on its own receipt), chained, stored and
fsync'd, and only then acknowledged. If the log's owner dies without closing (kill -9), stdin reaches its end and
this process exits at once without committing anything more, as a crash would: the owner
acknowledged nothing of it. It never touches the decision service's interpreter lock.
"""

from __future__ import annotations

import json
import marshal
import os
import select
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .draft_encoder import EncodedDraft, draft_values, encode_draft, encode_drafts, split_drafts
from .frames import COUNT, HEADER, Ack, FromWriter, ToWriter, frame, split, write_all
from .index_columns import IndexRow, index_row

if TYPE_CHECKING:
    from .redaction import Redactor
from .head import Head, sign_head, write_head
from .writer import ChainWriter, HeadSink, RotateError, Signer, WriterConfig

_NO_INDEX: IndexRow = ()  # store v1: SQLite generates the index columns

_READ = 1 << 20


def _signer(cfg: WriterConfig) -> Signer | None:
    if cfg.signing_key is None:
        return None
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from . import checkpoints

    key = Ed25519PrivateKey.from_private_bytes(cfg.signing_key)
    return lambda seq, h, wall, final, opens, sealed: checkpoints.sign(key, cfg.log_id, seq, h.hex(), wall, final, opens, sealed)


def _head_sink(cfg: WriterConfig) -> HeadSink:
    """Replaces `<log>.head` after each commit that wrote a checkpoint (`head.py`)."""
    key = None
    if cfg.signing_key is not None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        key = Ed25519PrivateKey.from_private_bytes(cfg.signing_key)
    durable = cfg.durability == "full"

    def sink(segment: int, seq: int, h: bytes, wall: float, final: bool, opens: bool) -> None:
        head = Head(cfg.log_id, segment, seq, h.hex(), wall, final, opens)
        try:
            write_head(cfg.path, sign_head(key, head) if key is not None else head, durable=durable)
        except OSError as e:  # the records are durable; only the proof of the log's end lags, and verify says so
            print(f"policyc audit writer: {cfg.path}: sealed head not written: {e.strerror}", file=sys.stderr, flush=True)

    return sink


ROTATE_SIGNAL = signal.SIGUSR1  # `policyc audit rotate` asks a running writer to rotate (`writer_pid_path`)


def writer_pid_path(log: str) -> Path:
    """Where the writer process of the log at `log` says its pid, for `policyc audit rotate`."""
    return Path(f"{log}.writer")


def rotated_path(log: str) -> Path:
    """Where a writer says how the last rotation asked by signal ended (JSON)."""
    return Path(f"{log}.rotated")


def _rotate(writer: ChainWriter, fd_out: int) -> bytes:
    """Rotate; the answer as JSON. An error past the move of the live file is fatal."""
    try:
        closed = writer.rotate()
    except RotateError as e:
        return json.dumps({"error": str(e)}).encode()
    except (sqlite3.Error, OSError) as e:
        _tell(fd_out, frame(FromWriter.FATAL, f"{writer.path}: rotation failed after the segment was closed: {e}".encode()))
        os._exit(1)
    return json.dumps({"segment": closed, "seq": writer.base_seq, "time": time.time()}).encode()


class _Drafts:
    """Wire drafts → (the bytes `AuditLog.submit_decision` would store, their index columns
    or None: derive them from the body). A draft of plain values of the declared types (the
    decision service's) is validated and written by `draft_encoder`'s strict structs,
    without pydantic; any other goes through `DecisionRecord` to be coerced or refused with
    its problems named."""

    def __init__(self, redact: tuple[str, ...]) -> None:
        from .redaction import Redactor  # here: a writer that is only handed bodies never loads pydantic

        self.redactor = Redactor(redact)
        self.names = self.redactor.names

    def __call__(self, payload: bytes) -> tuple[bytes, IndexRow | None]:
        """One DRAFT frame's draft."""
        encoded = encode_draft(payload)  # None: the strict structs refused it; the model decides
        if encoded is None:
            return _by_model(payload, self.redactor), None
        return self._redacted(encoded)

    def _redacted(self, e: EncodedDraft) -> tuple[bytes, IndexRow | None]:
        if self.names.isdisjoint(map(str.lower, e.headers)) or not self.redactor.secrets(e.headers):
            return e.body, e.columns
        return self.redactor.redact_json(e.body.decode(), e.headers).encode(), None  # (may change indexed text too)

    def batch(self, payload: memoryview, count: int) -> list[tuple[bytes, IndexRow | None] | str]:
        """A DRAFTS frame's `count` drafts, each stored as above or the message saying why
        it is not. The whole batch in two msgspec calls when every draft is plainly valid;
        else draft by draft, as single DRAFT frames would be."""
        encoded = encode_drafts(payload)
        if encoded is not None and len(encoded) == count:
            return [self._redacted(e) for e in encoded]
        try:
            items = split_drafts(payload)
        except ValueError as e:
            return [str(e)] * count
        out: list[tuple[bytes, IndexRow | None] | str] = []
        for item in items[:count]:
            try:
                out.append(self(item))
            except Exception as e:  # noqa: BLE001 (reported on the record's receipt)
                out.append(str(e) or type(e).__name__)
        return out + ["decision drafts batch is shorter than its count"] * (count - len(out))


def _by_model(payload: bytes, redactor: Redactor) -> bytes:
    from pydantic import ValidationError

    from .records import DecisionRecord

    draft = draft_values(payload)
    try:
        record = DecisionRecord.model_validate(draft)
    except ValidationError as e:
        where = draft.get("decision_id", "?") if isinstance(draft, dict) else "?"
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'record'}: {err['msg']}" for err in e.errors()[:5])
        raise ValueError(f"decision draft `{where}` is not a valid decision record: {problems}") from None
    return redactor.dump(record, record.request).encode()


def _read_init(fd: int, buf: bytearray) -> WriterConfig:
    """The configuration frame; frames that arrived behind it stay in `buf`."""
    while True:
        if len(buf) >= HEADER.size:
            n, kind = HEADER.unpack_from(buf)
            if kind != ToWriter.INIT:
                raise SystemExit("audit writer: the first frame is not its configuration")
            if len(buf) >= HEADER.size + n:
                cfg = WriterConfig.from_wire(marshal.loads(bytes(buf[HEADER.size : HEADER.size + n])))
                del buf[: HEADER.size + n]
                return cfg
        chunk = os.read(fd, _READ)
        if not chunk:
            os._exit(0)
        buf += chunk


def serve(fd_in: int, fd_out: int) -> None:
    buf = bytearray()
    cfg = _read_init(fd_in, buf)
    try:
        writer = ChainWriter(cfg, _signer(cfg), _head_sink(cfg))
        writer.write([], opens=True)  # the session's start, signed: entries after a close record need it
    except (sqlite3.Error, ValueError) as e:
        _tell(fd_out, frame(FromWriter.FATAL, f"{cfg.path}: audit writer cannot open the log: {e}".encode()))
        return
    drafts: _Drafts | None = _Drafts(cfg.redact) if cfg.warm else None  # (~0.1 s of imports, before READY rather than on the first draft)
    wake_r, wake_w = os.pipe()  # a rotation asked by signal wakes the select below
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(ROTATE_SIGNAL, lambda *_: None)
    try:
        writer_pid_path(cfg.path).write_text(str(os.getpid()))
    except OSError:
        pass  # only `policyc audit rotate` against a running writer needs it
    _tell(fd_out, frame(FromWriter.READY, b""))
    indexed = cfg.indexed
    ticket = 0
    while True:
        due = writer.seal_due_in()
        if due is not None and due <= 0:
            _commit(writer, fd_out, ticket, [], [])
            continue
        if len(buf) < HEADER.size or len(buf) < HEADER.size + HEADER.unpack_from(buf)[0]:  # no whole frame yet
            ready = select.select([fd_in, wake_r], [], [], due)[0]
            if wake_r in ready:
                if ROTATE_SIGNAL in os.read(wake_r, 64):  # everything read so far is committed: a batch boundary
                    answer = _rotate(writer, fd_out)
                    _write_status(rotated_path(cfg.path), answer)
                continue
            if not ready:
                continue  # the periodic checkpoint is due: sealed at the top of the loop
            chunk = os.read(fd_in, _READ)
            if not chunk:
                os._exit(0)  # the owner died without closing: stop as a crash would
            buf += chunk
        records: list[tuple[bytes, IndexRow]] = []
        failed: list[tuple[int, int, str]] = []
        first, closing = ticket, False
        for kind, payload in split(buf):
            if kind == ToWriter.DRAFTS:
                if drafts is None:
                    drafts = _Drafts(cfg.redact)
                for got in drafts.batch(memoryview(payload)[COUNT.size :], COUNT.unpack_from(payload)[0]):
                    if isinstance(got, str):
                        failed.append((ticket, ticket + 1, got))
                    else:
                        records.append((got[0], (got[1] or index_row(got[0])) if indexed else _NO_INDEX))
                    ticket += 1
            elif kind == ToWriter.BODY or kind == ToWriter.DRAFT:
                try:
                    index: IndexRow | None = None
                    if kind == ToWriter.DRAFT:
                        if drafts is None:
                            drafts = _Drafts(cfg.redact)
                        payload, index = drafts(payload)
                    records.append((payload, (index or index_row(payload)) if indexed else _NO_INDEX))
                except Exception as e:  # noqa: BLE001 (reported on the record's receipt)
                    failed.append((ticket, ticket + 1, str(e) or type(e).__name__))
                ticket += 1
            elif kind == ToWriter.CHECKPOINT:
                writer.force_seal()
            elif kind == ToWriter.ROTATE:  # what came before goes to the closing segment, what follows to the next
                _commit(writer, fd_out, first, records, failed, end=ticket)
                records, failed, first = [], [], ticket
                _tell(fd_out, frame(FromWriter.ROTATED, _rotate(writer, fd_out)))
            elif kind == ToWriter.CLOSE:
                closing = True
                break
        if ticket > first or (writer.seal_due_in() == 0):
            _commit(writer, fd_out, first, records, failed, end=ticket)
        if closing:
            message = ""
            try:
                writer.write([], final=True)
                writer.close()
            except sqlite3.Error as e:
                message = f"{cfg.path}: final checkpoint not written: {e}"
            writer_pid_path(cfg.path).unlink(missing_ok=True)
            _tell(fd_out, frame(FromWriter.CLOSED, message.encode()))
            return


def _write_status(path: Path, answer: bytes) -> None:
    try:
        tmp = Path(f"{path}.tmp")
        tmp.write_bytes(answer)
        os.replace(tmp, path)
    except OSError as e:
        print(f"policyc audit writer: {path}: rotation status not written: {e.strerror}", file=sys.stderr, flush=True)


def _commit(writer: ChainWriter, fd_out: int, first: int, records: list[tuple[bytes, IndexRow]], failed: list[tuple[int, int, str]],
            end: int | None = None) -> None:
    end = first if end is None else end
    seq_base = writer.seq + 1
    t0 = time.perf_counter()
    try:
        writer.write(records)
    except sqlite3.Error as e:
        failed = [(first, end, f"{writer.path}: batch not stored: {e}")]
        if not records:
            writer.sealed_time = time.monotonic()  # a failed seal is retried after an interval, not at once
    if end > first or records:
        _tell(fd_out, Ack(first, end, seq_base, tuple(failed), writer.seq, writer.commits, time.perf_counter() - t0).encode())


def _tell(fd_out: int, data: bytes) -> None:
    """Send to the log's owner; if it is gone (killed), stop as a crash would, without the
    clean SQLite close that would tidy the files away and hide what a crash leaves."""
    try:
        write_all(fd_out, data)
    except OSError:
        os._exit(0)


PROFILE_ENV = "POLICYC_AUDIT_WRITER_PROFILE"  # a path prefix: cProfile (CPU time) stats to <prefix>.<pid>


def main() -> None:
    """Serve the log's pipes; with PROFILE_ENV set, under cProfile (the writer's CPU per
    record is what slows a decision service sharing its core: this is how it is found)."""
    prefix = os.environ.get(PROFILE_ENV)
    if not prefix:
        serve(sys.stdin.fileno(), int(sys.argv[1]))
        return
    import cProfile

    profile = cProfile.Profile(time.process_time)
    profile.enable()
    try:
        serve(sys.stdin.fileno(), int(sys.argv[1]))
    finally:
        profile.disable()
        profile.dump_stats(f"{prefix}.{os.getpid()}")


if __name__ == "__main__":
    main()
