"""The sealed head: a signed statement, kept beside the log, of where the log ended at its
last checkpoint.

The chain and its checkpoints live in one file; someone who can edit that file can delete
its last entries *and* the checkpoints that sealed them, or only its close record, and what
remains is a shorter log that checks out. An anchor kept elsewhere (`verify --anchor`,
etcd) catches that; the head catches it without one. After every commit that writes a
checkpoint, the writer replaces `<log>.head` (write, fsync, rename) with that checkpoint's
seq, hash, time and close flag, signed under a domain of its own: a head cannot be made from
a checkpoint that is still in the log, so cutting the log back to an earlier checkpoint
needs a head saved from that earlier time. `verify` requires the checkpoint the head names
to be in the log as it was written.

What it cannot do: an attacker who deletes the head file as well leaves a log whose end is
unproven, and `verify` says exactly that (amber, never green); one who saved an old head
and puts it back rolls the proof back with it. Only an anchor held elsewhere rules those out.

Plain dataclass and JSON: the writer process writes it and never loads pydantic.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

HEAD_DOMAIN = b"policyc.audit.head/v1"


def head_path(log: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(log)}.head")


@dataclass(frozen=True, slots=True)
class Head:
    log_id: str
    segment: int
    seq: int
    hash: str  # hex
    time: float  # the checkpoint's time, as stored
    final: bool
    opens: bool
    public_key: str | None = None
    signature: str | None = None

    def payload(self) -> bytes:
        return b"\n".join((HEAD_DOMAIN, self.log_id.encode(), str(self.segment).encode(), str(self.seq).encode(), self.hash.encode(),
                           repr(self.time).encode(), b"1" if self.final else b"0", b"1" if self.opens else b"0"))

    def to_json(self) -> str:
        return json.dumps({"schema": "policyc.audit.head/v1", **asdict(self)}, sort_keys=True)


def sign_head(key: object, head: Head) -> Head:
    """`head` signed by `key` (an Ed25519PrivateKey)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    assert isinstance(key, Ed25519PrivateKey)
    return Head(head.log_id, head.segment, head.seq, head.hash, head.time, head.final, head.opens,
                key.public_key().public_bytes_raw().hex(), key.sign(head.payload()).hex())


def head_signature_valid(public_key: object, head: Head) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    assert isinstance(public_key, Ed25519PublicKey)
    if head.signature is None:
        return False
    try:
        public_key.verify(bytes.fromhex(head.signature), head.payload())
    except (InvalidSignature, ValueError):
        return False
    return True


def write_head(log: str | os.PathLike[str], head: Head, *, durable: bool) -> None:
    """Replace the head file atomically (durably when `durable`)."""
    p = head_path(log)
    tmp = Path(f"{p}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(head.to_json())
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, p)
    if durable:
        fd = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class HeadUnreadable(ValueError):
    """The head file exists but is not a head (edited, truncated)."""


def read_head(log: str | os.PathLike[str]) -> Head | None:
    """The head beside the log, None when there is none; HeadUnreadable when it is damaged."""
    p = head_path(log)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise HeadUnreadable(f"{p}: not a sealed head ({e})") from None
    try:
        if raw.get("schema") != "policyc.audit.head/v1":
            raise HeadUnreadable(f"{p}: not a sealed head (schema {raw.get('schema')!r})")
        return Head(str(raw["log_id"]), int(raw["segment"]), int(raw["seq"]), str(raw["hash"]), float(raw["time"]), bool(raw["final"]),
                    bool(raw["opens"]), raw.get("public_key"), raw.get("signature"))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise HeadUnreadable(f"{p}: not a sealed head ({e})") from None
