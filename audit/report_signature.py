"""A detached ed25519 signature over a report file (`policyc audit report --sign KEY`), and
its check (`policyc audit verify-report`).

The signature covers the file's sha256 under a domain of its own, so a report signature
can never pass as a checkpoint's or a bundle's. It lives beside the report in
`<report>.sig` (JSON: the digest, the signer's public key for identification, the
signature); verification uses the key the auditor is given, never the one in the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import AuditInputError

DOMAIN = b"policyc.audit.report-signature/v1\n"
SCHEMA = "policyc.audit.report-signature/v1"


def signature_path(report: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(report)}.sig")


def _digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise AuditInputError(f"{path}: cannot read the report: {e.strerror}") from None


def sign_report(report: str | os.PathLike[str], key: Ed25519PrivateKey) -> Path:
    """Write `<report>.sig` for the file as it is now; returns its path."""
    p = Path(report)
    digest = _digest(p)
    doc = {"schema": SCHEMA, "file": p.name, "sha256": digest, "public_key": key.public_key().public_bytes_raw().hex(),
           "signature": key.sign(DOMAIN + digest.encode()).hex()}
    out = signature_path(p)
    try:
        out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    except OSError as e:
        raise AuditInputError(f"{out}: cannot write the signature: {e.strerror}") from None
    return out


@dataclass(frozen=True, slots=True)
class ReportCheck:
    ok: bool
    message: str


def verify_report(report: str | os.PathLike[str], public_key: Ed25519PublicKey, signature: str | os.PathLike[str] | None = None) -> ReportCheck:
    """Whether `report` is, byte for byte, the file the holder of `public_key` signed."""
    p = Path(report)
    sig = Path(signature) if signature is not None else signature_path(p)
    try:
        doc = json.loads(sig.read_text(encoding="utf-8"))
        claimed, value = str(doc["sha256"]), bytes.fromhex(doc["signature"])
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"schema {doc.get('schema')!r}")
    except FileNotFoundError:
        raise AuditInputError(f"{sig}: no signature file (sign the report with `policyc audit report --sign KEY`)") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AuditInputError(f"{sig}: not a report signature ({e})") from None
    digest = _digest(p)
    if digest != claimed:
        return ReportCheck(False, f"{p}: the file changed after it was signed (sha256 {digest[:16]}..., signed {claimed[:16]}...)")
    try:
        public_key.verify(value, DOMAIN + digest.encode())
    except InvalidSignature:
        return ReportCheck(False, f"{p}: the signature does not verify with the given public key")
    return ReportCheck(True, f"{p}: signature valid (sha256 {digest})")
