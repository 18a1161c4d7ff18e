"""Verifying a TPM 2.0 quote with `cryptography` alone (the decision service needs no
tpm2-tools): the attestation key's public area, the signed `TPMS_ATTEST` and its
`TPMT_SIGNATURE`, parsed from their TPM wire form (big-endian, TPM 2.0 Part 2).

    key = AttestationKey.parse(ak_pub)                   # TPM2B_PUBLIC, as `tpm2_create -u` writes it
    facts = verify_quote(key, nonce, msg, sig, pcr_values, selection)

A quote is accepted only when every check holds, each refused with its own reason:
the key is a restricted ECC P-256 signing key that never leaves its TPM (a restricted key
signs only what the TPM itself made, so a TPMS_ATTEST cannot be forged with it); the
signature verifies over the message with that key; the message is a TPM-made quote
(magic, type); its extraData is exactly the nonce the service issued; its PCR selection is
the one asked for; its PCR digest is the hash of the PCR values the agent sent (which are
then what the fact records); and, when the enrollment holds reference values, they match.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

TPM_GENERATED = 0xFF544347
ST_ATTEST_QUOTE = 0x8018
ALG_ECC, ALG_SHA256, ALG_ECDSA, ALG_NULL = 0x0023, 0x000B, 0x0018, 0x0010
ECC_NIST_P256 = 0x0003
# objectAttributes bits an attestation key must have
FIXED_TPM, FIXED_PARENT, SENSITIVE_DATA_ORIGIN, RESTRICTED, SIGN = 1 << 1, 1 << 4, 1 << 5, 1 << 16, 1 << 18
AK_ATTRIBUTES = {"fixedtpm": FIXED_TPM, "fixedparent": FIXED_PARENT, "sensitivedataorigin": SENSITIVE_DATA_ORIGIN,
                 "restricted": RESTRICTED, "sign": SIGN}
MAX_BLOB = 4096  # bytes: every structure here is far smaller


class AttestationError(ValueError):
    """A key or quote refused; the message says which check failed."""


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        if len(data) > MAX_BLOB:
            raise AttestationError(f"{what}: {len(data)} bytes; at most {MAX_BLOB}")
        self.data, self.at, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise AttestationError(f"{self.what}: truncated at byte {self.at} (wanted {n} more)")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u8(self) -> int:
        return int(self.take(1)[0])

    def u16(self) -> int:
        return int(struct.unpack(">H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack(">I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack(">Q", self.take(8))[0])

    def sized(self) -> bytes:
        return self.take(self.u16())

    def end(self) -> None:
        if self.at != len(self.data):
            raise AttestationError(f"{self.what}: {len(self.data) - self.at} trailing bytes")


@dataclass(frozen=True)
class AttestationKey:
    """An attestation key's public area: its TPM name (nameAlg ‖ SHA-256 of the area) and
    its ECDSA public key."""

    public_area: bytes  # TPMT_PUBLIC
    name: bytes
    public_key: ec.EllipticCurvePublicKey

    @classmethod
    def parse(cls, tpm2b_public: bytes) -> "AttestationKey":
        """From a TPM2B_PUBLIC; AttestationError unless it is an attestation key."""
        outer = _Reader(tpm2b_public, "attestation key")
        area = outer.sized()
        outer.end()
        r = _Reader(area, "attestation key")
        kind, name_alg, attrs = r.u16(), r.u16(), r.u32()
        if kind != ALG_ECC:
            raise AttestationError(f"attestation key: type 0x{kind:04x}; an ECC key (0x{ALG_ECC:04x}) is required")
        if name_alg != ALG_SHA256:
            raise AttestationError(f"attestation key: name algorithm 0x{name_alg:04x}; SHA-256 is required")
        missing = [n for n, bit in AK_ATTRIBUTES.items() if not attrs & bit]
        if missing:
            raise AttestationError(f"attestation key: lacks {', '.join(missing)}: not a restricted signing key bound to its TPM")
        r.sized()  # authPolicy
        if r.u16() != ALG_NULL:
            raise AttestationError("attestation key: has a symmetric algorithm: a signing key has none")
        scheme = r.u16()
        if scheme != ALG_ECDSA or r.u16() != ALG_SHA256:
            raise AttestationError("attestation key: scheme is not ECDSA with SHA-256")
        curve = r.u16()
        if curve != ECC_NIST_P256:
            raise AttestationError(f"attestation key: curve 0x{curve:04x}; NIST P-256 is required")
        if r.u16() != ALG_NULL:
            raise AttestationError("attestation key: has a KDF: a signing key has none")
        x, y = r.sized(), r.sized()
        r.end()
        if len(x) != 32 or len(y) != 32:
            raise AttestationError("attestation key: the public point is not 32-byte coordinates")
        try:
            key = ec.EllipticCurvePublicNumbers(int.from_bytes(x, "big"), int.from_bytes(y, "big"), ec.SECP256R1()).public_key()
        except ValueError as e:
            raise AttestationError(f"attestation key: the public point is not on P-256 ({e})") from None
        return cls(area, struct.pack(">H", ALG_SHA256) + hashlib.sha256(area).digest(), key)


@dataclass(frozen=True)
class Quote:
    """What an agent answers a challenge with: `tpm2_quote`'s message, signature and the
    PCR values (in selection order) the digest covers."""

    message: bytes  # TPMS_ATTEST
    signature: bytes  # TPMT_SIGNATURE
    pcr_values: tuple[bytes, ...]


@dataclass(frozen=True)
class QuoteFacts:
    """What a verified quote establishes."""

    pcrs: dict[int, str]  # PCR index → hex value (SHA-256 bank)
    clock: int  # the TPM's clock (ms) and its reset/restart counts when it quoted
    reset_count: int
    restart_count: int


def parse_selection(text: str) -> tuple[int, ...]:
    """`sha256:0,1,2,7` → (0, 1, 2, 7); ValueError naming the problem."""
    bank, sep, idx = text.partition(":")
    if bank != "sha256" or not sep:
        raise ValueError(f"PCR selection `{text}`: expected sha256:N,N,… (only the SHA-256 bank is verified)")
    try:
        pcrs = tuple(sorted({int(i) for i in idx.split(",")}))
    except ValueError:
        raise ValueError(f"PCR selection `{text}`: PCR indices must be whole numbers") from None
    if not pcrs or pcrs[0] < 0 or pcrs[-1] > 23:
        raise ValueError(f"PCR selection `{text}`: indices must be 0-23")
    return pcrs


def selection_text(pcrs: tuple[int, ...]) -> str:
    return "sha256:" + ",".join(str(i) for i in pcrs)


def verify_quote(key: AttestationKey, nonce: bytes, quote: Quote, pcrs: tuple[int, ...],
                 reference: dict[int, str] | None = None) -> QuoteFacts:
    """The checks of the module docstring, in order; AttestationError names the first that fails."""
    sig = _Reader(quote.signature, "quote signature")
    alg = sig.u16()
    if alg != ALG_ECDSA or sig.u16() != ALG_SHA256:
        raise AttestationError(f"quote signature: algorithm 0x{alg:04x}; ECDSA with SHA-256 is required")
    r, s = sig.sized(), sig.sized()
    sig.end()
    try:
        key.public_key.verify(encode_dss_signature(int.from_bytes(r, "big"), int.from_bytes(s, "big")), quote.message,
                              ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise AttestationError("quote signature: does not verify with the host's enrolled attestation key "
                               "(signed by another key, or the message was altered)") from None
    m = _Reader(quote.message, "quote")
    if m.u32() != TPM_GENERATED or m.u16() != ST_ATTEST_QUOTE:
        raise AttestationError("quote: not a TPM-generated quote (magic or type)")
    m.sized()  # qualifiedSigner
    extra = m.sized()
    if extra != nonce:
        raise AttestationError("quote: its nonce is not the one issued for this challenge, with the facts sent "
                               "(a replayed or stale quote, or facts altered after the TPM signed them)")
    clock, resets, restarts = m.u64(), m.u32(), m.u32()
    m.u8()  # safe
    m.u64()  # firmware version
    selected: list[int] = []
    for _ in range(m.u32()):
        bank, size = m.u16(), m.u8()
        bits = m.take(size)
        if bank != ALG_SHA256:
            raise AttestationError(f"quote: selects PCR bank 0x{bank:04x}; only SHA-256 is verified")
        selected += [8 * i + j for i, b in enumerate(bits) for j in range(8) if b >> j & 1]
    digest = m.sized()
    m.end()
    if tuple(sorted(selected)) != pcrs:
        raise AttestationError(f"quote: covers PCRs {selection_text(tuple(sorted(selected)))}, not {selection_text(pcrs)}")
    if len(quote.pcr_values) != len(pcrs) or any(len(v) != 32 for v in quote.pcr_values):
        raise AttestationError(f"quote: {len(quote.pcr_values)} PCR values for {len(pcrs)} PCRs, each 32 bytes")
    if hashlib.sha256(b"".join(quote.pcr_values)).digest() != digest:
        raise AttestationError("quote: the PCR values sent are not the ones the TPM signed (digest differs)")
    values = {i: v.hex() for i, v in zip(pcrs, quote.pcr_values)}
    for i, want in (reference or {}).items():
        if values.get(i) != want:
            raise AttestationError(f"quote: PCR {i} is {values.get(i, 'not quoted')[:16]}…, not the enrolled reference "
                                   f"{want[:16]}… (the host's measured state changed)")
    return QuoteFacts(values, clock, resets, restarts)
