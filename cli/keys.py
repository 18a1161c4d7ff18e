"""Reading ed25519 keys for bundle signing (PEM, or 64 hex digits of raw key)."""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class KeyError_(Exception):
    pass


def _read(path: str) -> bytes:
    """A key file: regular, at most 64 KiB (a FIFO or /dev/zero is refused, never read)."""
    from policyc.compiler import bounded_read
    from policyc.compiler import limits

    try:
        return bounded_read.read_bytes(path, limits.MAX_KEY_BYTES, "key")
    except bounded_read.FileRefused as e:
        raise KeyError_(str(e)) from None


def load_private(path: str) -> Ed25519PrivateKey:
    data = _read(path)
    try:
        if data.strip().startswith(b"-----"):
            key = serialization.load_pem_private_key(data, password=None)
        else:
            key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(data.decode().strip()))
    except (ValueError, TypeError, UnicodeDecodeError):
        raise KeyError_(f"`{path}` is not an ed25519 private key (PEM or 64 hex digits)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyError_(f"`{path}` is not an ed25519 key")
    return key


def load_public(path: str) -> Ed25519PublicKey:
    data = _read(path)
    try:
        if data.strip().startswith(b"-----"):
            key = serialization.load_pem_public_key(data)
        else:
            key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(data.decode().strip()))
    except (ValueError, TypeError, UnicodeDecodeError):
        raise KeyError_(f"`{path}` is not an ed25519 public key (PEM or 64 hex digits)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyError_(f"`{path}` is not an ed25519 key")
    return key


def generate(private_path: str, public_path: str) -> None:
    key = Ed25519PrivateKey.generate()
    Path(private_path).write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                     serialization.NoEncryption()))
    Path(private_path).chmod(0o600)
    Path(public_path).write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                serialization.PublicFormat.SubjectPublicKeyInfo))
