"""Signed checkpoints: periodic seals over the head of the chain.

A hash chain alone shows that entries agree with each other; someone able to rewrite the
whole tail could recompute every hash. A checkpoint signs (log id, seq, hash at seq, time)
with an ed25519 key the operator holds, so rewriting anything at or before a signed seq
needs that key. A checkpoint is written every N entries or T seconds, when the log is
closed (`final`: the close record) and when it is opened (`opens`: the session's start, so
that entries after a close record without a later signed opening are known to be forged);
a checkpoint whose seq is past the end of the log proves truncation. Since v2 a checkpoint
also keeps the hashes of the entries it seals (`sealed`, since the previous checkpoint; its
digest is signed), so a chain rewritten and re-hashed from entry 150 on is reported at 150.
Without a key, checkpoints are still written (unsigned): they keep truncation evident,
but only against someone who does not also edit the checkpoint table.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ConfigDict

from .errors import AuditInputError

CHECKPOINT_DOMAIN = b"policyc.audit.checkpoint/v1"
CHECKPOINT_DOMAIN_V2 = b"policyc.audit.checkpoint/v2"
HASH_BYTES = 32


class Checkpoint(BaseModel):
    """A seal as stored (and as exported for `verify --anchor`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: int
    seq: int
    hash: str  # hex of the entry hash at `seq`
    time: float
    final: bool
    public_key: str | None = None  # hex; identification only, verification uses the caller's key
    signature: str | None = None  # hex
    opens: bool = False  # written when a writer opened the log (v2)
    sealed_digest: str | None = None  # v2: hex sha256 of the sealed entries' hashes (None: a v1 checkpoint)


def payload(log_id: str, seq: int, hash_hex: str, time: float, final: bool, opens: bool = False, sealed_digest: str | None = None) -> bytes:
    """The bytes a checkpoint signature covers (v1 when it keeps no sealed hashes)."""
    head = (log_id.encode(), str(seq).encode(), hash_hex.encode(), repr(time).encode(), b"1" if final else b"0")
    if sealed_digest is None and not opens:
        return b"\n".join((CHECKPOINT_DOMAIN, *head))
    return b"\n".join((CHECKPOINT_DOMAIN_V2, *head, b"1" if opens else b"0", (sealed_digest or "").encode()))


def sealed_digest(sealed: bytes) -> str:
    """The digest of a checkpoint's sealed hashes that its signature covers."""
    return hashlib.sha256(sealed).hexdigest()


def sign(key: Ed25519PrivateKey, log_id: str, seq: int, hash_hex: str, time: float, final: bool, opens: bool = False,
         sealed: bytes | None = None) -> tuple[str, str]:
    """(public key hex, signature hex)."""
    pub = key.public_key().public_bytes_raw().hex()
    digest = None if sealed is None else sealed_digest(sealed)
    return pub, key.sign(payload(log_id, seq, hash_hex, time, final, opens, digest)).hex()


def signature_valid(key: Ed25519PublicKey, log_id: str, cp: Checkpoint) -> bool:
    if cp.signature is None:
        return False
    try:
        key.verify(bytes.fromhex(cp.signature), payload(log_id, cp.seq, cp.hash, cp.time, cp.final, cp.opens, cp.sealed_digest))
    except (InvalidSignature, ValueError):
        return False
    return True


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    """An ed25519 private key from a PEM file (PKCS8, as `policyc keygen` writes) or 32 bytes in hex."""
    data = _read(path, "signing key")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(data.decode().strip()))
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise AuditInputError(f"{path}: not an ed25519 private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise AuditInputError(f"{path}: not an ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """An ed25519 public key from a PEM file or a file holding 32 bytes in hex."""
    data = _read(path, "public key")
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(data.decode().strip()))
    except (ValueError, TypeError, UnicodeDecodeError) as e:
        raise AuditInputError(f"{path}: not an ed25519 public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise AuditInputError(f"{path}: not an ed25519 public key")
    return key


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise AuditInputError(f"{path}: cannot read {what}: {e.strerror}") from None
