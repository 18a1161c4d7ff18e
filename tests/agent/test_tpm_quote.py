"""A quote from a real software TPM verified with `cryptography` alone, and each way a quote
or a key is refused: a quote signed by another TPM's key, one carrying another nonce (a
replay), one over other PCRs, PCR values that are not the signed ones, a measured state
that differs from the enrolled reference, a signature altered, and a key that is not a
restricted TPM-bound signing key."""

from __future__ import annotations

import os

import pytest

from policyc.cluster.tpm import HostTpm
from policyc.cluster.tpm_quote import AttestationError, AttestationKey, Quote, verify_quote

PCRS = (0, 1, 2, 7)


def test_a_fresh_quote_verifies_with_the_key_that_made_it(tpms) -> None:  # type: ignore[no-untyped-def]
    key = AttestationKey.parse(tpms["a"].attestation_key())
    nonce = os.urandom(32)
    facts = verify_quote(key, nonce, tpms["a"].quote(nonce, PCRS), PCRS)
    assert sorted(facts.pcrs) == list(PCRS) and all(len(v) == 64 for v in facts.pcrs.values())
    assert key.name[:2] == b"\x00\x0b" and len(key.name) == 34  # SHA-256 name of the public area
    assert tpms["a"].attestation_key() == tpms["a"].attestation_key()  # made once, kept


def _refused(key: AttestationKey, nonce: bytes, quote: Quote, match: str, pcrs: tuple[int, ...] = PCRS,
             reference: dict[int, str] | None = None) -> None:
    with pytest.raises(AttestationError, match=match):
        verify_quote(key, nonce, quote, pcrs, reference)


def test_forged_replayed_and_altered_quotes_are_refused(tpms) -> None:  # type: ignore[no-untyped-def]
    key_a = AttestationKey.parse(tpms["a"].attestation_key())
    nonce = os.urandom(32)
    good = tpms["a"].quote(nonce, PCRS)
    # another TPM's quote for the same nonce: its signature does not verify with a's key
    _refused(key_a, nonce, tpms["b"].quote(nonce, PCRS), "does not verify with the host's enrolled attestation key")
    # yesterday's quote answered to today's challenge
    _refused(key_a, os.urandom(32), good, "nonce is not the one issued")
    _refused(key_a, nonce, good, "covers PCRs sha256:0,1,2,7, not sha256:0,1,2", pcrs=(0, 1, 2))
    _refused(key_a, nonce, Quote(good.message, good.signature, (b"\x01" * 32,) + good.pcr_values[1:]),
             "not the ones the TPM signed")
    sig = bytearray(good.signature)
    sig[10] ^= 1
    _refused(key_a, nonce, Quote(good.message, bytes(sig), good.pcr_values), "does not verify")
    msg = bytearray(good.message)
    msg[-1] ^= 1
    _refused(key_a, nonce, Quote(bytes(msg), good.signature, good.pcr_values), "does not verify")
    _refused(key_a, nonce, Quote(good.message + b"\0", good.signature, good.pcr_values), "does not verify")


def test_a_changed_measured_state_is_refused_against_the_enrolled_reference(tpms) -> None:  # type: ignore[no-untyped-def]
    t = tpms["d"]
    key = AttestationKey.parse(t.attestation_key())
    n1 = os.urandom(32)
    reference = verify_quote(key, n1, t.quote(n1, PCRS), PCRS).pcrs
    t.extend(7, b"an unsigned boot loader")
    n2 = os.urandom(32)
    _refused(key, n2, t.quote(n2, PCRS), "PCR 7 is .* not the enrolled reference", reference=reference)
    assert verify_quote(key, n2, t.quote(n2, PCRS), PCRS).pcrs[7] != reference[7]  # without a reference: accepted, recorded


def test_a_key_that_could_sign_anything_is_not_an_attestation_key(tpms, tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = tpms["a"]
    unrestricted = HostTpm(a.tcti, tmp_path)
    work = tmp_path / "w"
    work.mkdir()
    unrestricted._run("tpm2_createprimary", "-Q", "-C", "o", "-g", "sha256", "-G", "ecc", "-c", str(work / "p.ctx"))
    unrestricted._flush()
    unrestricted._run("tpm2_create", "-Q", "-C", str(work / "p.ctx"), "-G", "ecc:ecdsa-sha256", "-g", "sha256",
                      "-u", str(work / "k.pub"), "-r", str(work / "k.priv"), "-a", "fixedtpm|fixedparent|sensitivedataorigin|userwithauth|sign")
    unrestricted._flush()
    with pytest.raises(AttestationError, match="lacks restricted"):
        AttestationKey.parse((work / "k.pub").read_bytes())
    with pytest.raises(AttestationError, match="truncated"):
        AttestationKey.parse(a.attestation_key()[:40])
    with pytest.raises(AttestationError, match="at most"):
        AttestationKey.parse(b"\0" * 10_000)
