"""Signal reports an enrolled host's agent signs, and the replica verifies before merging.

The attestation key cannot sign a report itself: it is a restricted TPM key that signs only
what the TPM produced (quotes), and a quote every 200 ms tick would cost a TPM round trip
each. So the agent makes an Ed25519 *report key* when it starts (in memory only: a
restarted agent has a new one), and publishes its public half among its host facts; the
quote signs those facts with the nonce, so once the leader has verified a quote the
report key is bound to the enrolled TPM. Each report is then signed with it:

    {"time": …, "interfaces": …, …, "sig": "<Ed25519 signature, hex>"}

The signature covers the report's bytes up to `,"sig":"` with the closing brace (the agent
writes `sig` last), so the verifier checks the bytes as sent, without re-serialising. For
an enrolled host a replica merges only a report that verifies with the report key of its
last verified quote, and whose time is later than the last one it took (a replayed old
report is refused); for a host that is not enrolled, a report is its agent's word, as
before (as trusted as write access to etcd).
"""

from __future__ import annotations

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

MARK = b',"sig":"'


class ReportKey:
    """The agent's side: a fresh key, its public half (hex) for the facts, and `sign`."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self.public_hex = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()

    def sign(self, body: bytes) -> bytes:
        """`body` (a JSON object's bytes, without `sig`) with its signature as the last field."""
        if not body.endswith(b"}") or MARK in body:
            raise ValueError("a report to sign is a JSON object without a `sig` field")
        sig = self._key.sign(body)
        return body[:-1] + MARK + sig.hex().encode() + b'"}'


def public_key(hex_text: str) -> Ed25519PublicKey:
    """ValueError for text that is not an Ed25519 public key in hex."""
    try:
        raw = bytes.fromhex(hex_text)
    except ValueError:
        raise ValueError("the report key is not hex") from None
    if len(raw) != 32:
        raise ValueError(f"the report key has {len(raw)} bytes (an Ed25519 key has 32)")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify(raw: bytes, key: Ed25519PublicKey) -> str:
    """Why `raw` is not a report signed with `key` ("" when it is)."""
    at = raw.rfind(MARK)
    if at < 0:
        return "unsigned (a report of an enrolled host must carry its agent's signature)"
    tail = raw[at + len(MARK):]
    if not tail.endswith(b'"}'):
        return "its signature is not its last field"
    try:
        sig = bytes.fromhex(tail[:-2].decode("ascii"))
        key.verify(sig, raw[:at] + b"}")
    except (ValueError, UnicodeDecodeError, InvalidSignature):
        return "its signature does not verify with the report key of the host's last verified quote"
    return ""


__all__ = ["ReportKey", "public_key", "verify"]
