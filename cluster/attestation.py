"""Attested TPM facts, through the fleet store the replicas already share.

    enroll(store, keys, "host-3", ak_pub)           # the operator (`policyc agent enroll`)
    fact = await Attestor(store, keys, "r0").attest("host-3")   # the control plane

The exchange: the control plane writes a fresh 32-byte nonce to `attest/challenges/<host>/<tag>`
(under a short lease; the tag is the nonce's first 16 bytes, so concurrent challenges do
not overwrite each other); that host's agent (`host_agent.py`) answers at
`attest/quotes/<host>/<tag>`, under the challenge's lease (both go when it is revoked),
with a TPM quote over the enrolled PCRs and the host facts its agent discovered (its
interfaces and addresses), the quote's qualifying data being SHA-256 of a label, the nonce
and those facts, so they are signed together; the control plane verifies it
against the key the operator enrolled for the host (`tpm_quote.verify_quote`: signature,
nonce, PCR selection and digest, reference values) and records the result at
`attest/facts/<host>`: attested (when, which key, which PCR values, which addresses) or
refused (why). A nonce is used for one challenge only: an old quote (replayed) carries another nonce and is
refused; a quote signed by any key but the enrolled one is refused.

`AttestationBook` is what a replica keeps of `attest/` from its watch, and the registration
rule: once any host of the fleet is enrolled, an instance claiming `tpm` must be on an
enrolled host whose last attestation succeeded within `max_age`; otherwise it is refused
(RegisterInstance: FAILED_PRECONDITION, E732) and not served (an instance written to the
store directly is kept aside until its host is attested).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from functools import cached_property

from .keys import Keys
from .store import Change, ChangeKind, Entry, FleetStore, StoreError
from .tpm_quote import AttestationError, AttestationKey, Quote, parse_selection, selection_text, verify_quote

DEFAULT_PCRS = (0, 1, 2, 3, 4, 5, 6, 7)  # the firmware and boot-loader measurements
ANSWER_TIMEOUT = 10.0  # seconds an agent has to answer a challenge
_HOST = re.compile(r"[A-Za-z0-9._-]{1,128}")


def check_host(host: str) -> str:
    """A host name that can be part of a store key; ValueError otherwise."""
    if not _HOST.fullmatch(host):
        raise ValueError(f"host `{host[:80]}`: expected 1-128 letters, digits, `.`, `_`, `-`")
    return host


def _json(key: str, raw: bytes) -> dict[str, object]:
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise AttestationError(f"{key}: not JSON ({e})") from None
    if not isinstance(body, dict):
        raise AttestationError(f"{key}: not a JSON object")
    return body


@dataclass(frozen=True)
class Enrollment:
    host: str
    ak_public: bytes  # TPM2B_PUBLIC
    pcrs: tuple[int, ...]
    reference: dict[int, str] = field(default_factory=dict)  # PCR → expected value (hex); empty: none checked
    enrolled_at: float = 0.0
    by: str = ""

    @cached_property
    def key(self) -> AttestationKey:
        return AttestationKey.parse(self.ak_public)

    def encode(self) -> bytes:
        return json.dumps({"host": self.host, "ak_public": base64.b64encode(self.ak_public).decode(),
                           "ak_name": self.key.name.hex(), "pcrs": selection_text(self.pcrs),
                           "reference": {str(i): v for i, v in sorted(self.reference.items())},
                           "enrolled_at": self.enrolled_at, "by": self.by}, sort_keys=True).encode()

    @classmethod
    def decode(cls, key: str, raw: bytes) -> "Enrollment":
        b = _json(key, raw)
        try:
            e = cls(str(b["host"]), base64.b64decode(str(b["ak_public"]), validate=True), parse_selection(str(b["pcrs"])),
                    {int(i): str(v) for i, v in dict(b.get("reference") or {}).items()},  # type: ignore[call-overload]
                    float(b.get("enrolled_at") or 0.0), str(b.get("by") or ""))  # type: ignore[arg-type]
        except (KeyError, TypeError, ValueError) as err:
            raise AttestationError(f"{key}: not an enrollment record ({err})") from None
        e.key  # noqa: B018 - refuse a record whose key is not an attestation key
        return e


@dataclass(frozen=True)
class AttestedFact:
    """What the control plane last established about a host's TPM."""

    host: str
    attested: bool
    time: float
    ak_name: str = ""
    pcrs: dict[int, str] = field(default_factory=dict)
    verified_by: str = ""
    why: str = ""  # when refused
    addresses: tuple[str, ...] = ()  # the host's routable addresses its agent reported, signed with the quote
    hardware: dict[str, object] | None = None  # its hardware and site facts (`host_hardware.Hardware`), signed with the quote
    report_key: str = ""  # the key its agent signs its signal reports with (`signed_reports.py`), signed with the quote

    def encode(self) -> bytes:
        body: dict[str, object] = {
            "host": self.host, "attested": self.attested, "time": self.time, "ak_name": self.ak_name,
            "pcrs": {str(i): v for i, v in sorted(self.pcrs.items())}, "verified_by": self.verified_by,
            "why": self.why, "addresses": list(self.addresses)}
        if self.hardware is not None:
            body["hardware"] = self.hardware
        if self.report_key:
            body["report_key"] = self.report_key
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, key: str, raw: bytes) -> "AttestedFact":
        b = _json(key, raw)
        try:
            return cls(str(b["host"]), bool(b["attested"]), float(b["time"]), str(b.get("ak_name") or ""),  # type: ignore[arg-type]
                       {int(i): str(v) for i, v in dict(b.get("pcrs") or {}).items()},  # type: ignore[call-overload]
                       str(b.get("verified_by") or ""), str(b.get("why") or ""),
                       tuple(str(ipaddress.ip_address(str(a))) for a in list(b.get("addresses") or [])[:256]),  # type: ignore[call-overload]
                       b["hardware"] if isinstance(b.get("hardware"), dict) else None,  # type: ignore[arg-type]
                       str(b.get("report_key") or "")[:128])
        except (KeyError, TypeError, ValueError) as err:
            raise AttestationError(f"{key}: not an attestation record ({err})") from None


def qualifying_data(nonce: bytes, facts: dict[str, object] | None) -> bytes:
    """What the TPM signs as the quote's extraData: the nonce bound to the facts the agent
    reports with it (none: an empty object), so neither can be swapped."""
    canonical = json.dumps(facts or {}, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(b"policyc-attest-v1\0" + nonce + canonical).digest()


@dataclass(frozen=True)
class Answer:
    nonce_hex: str
    quote: Quote
    facts: dict[str, object] | None  # HostFacts.to_json() of the answering host, or None


def encode_answer(nonce_hex: str, quote: Quote, facts: dict[str, object] | None = None) -> bytes:
    return json.dumps({"nonce": nonce_hex, "message": base64.b64encode(quote.message).decode(),
                       "signature": base64.b64encode(quote.signature).decode(),
                       "pcr_values": [v.hex() for v in quote.pcr_values], "facts": facts, "time": time.time()}).encode()


def decode_answer(key: str, raw: bytes) -> Answer:
    if len(raw) > 256 * 1024:
        raise AttestationError(f"{key}: an answer of {len(raw):,} bytes (at most 256 KiB)")
    b = _json(key, raw)
    try:
        values = b["pcr_values"]
        if not isinstance(values, list) or len(values) > 24:
            raise ValueError("pcr_values must be a list of at most 24")
        facts = b.get("facts")
        if facts is not None and not isinstance(facts, dict):
            raise ValueError("facts must be an object")
        return Answer(str(b["nonce"]), Quote(base64.b64decode(str(b["message"]), validate=True),
                                             base64.b64decode(str(b["signature"]), validate=True),
                                             tuple(bytes.fromhex(str(v)) for v in values)), facts)
    except (KeyError, TypeError, ValueError) as err:
        raise AttestationError(f"{key}: not a quote answer ({err})") from None


async def enroll(store: FleetStore, keys: Keys, host: str, ak_public: bytes, *, pcrs: tuple[int, ...] = DEFAULT_PCRS,
                 reference: dict[int, str] | None = None, by: str = "") -> Enrollment:
    """Record `ak_public` as `host`'s attestation key (replacing an earlier one). The key is
    checked first (AttestationError: not a restricted TPM-bound signing key)."""
    e = Enrollment(check_host(host), ak_public, pcrs, dict(reference or {}), time.time(), by)
    e.key  # noqa: B018 - parse before storing
    await store.put(keys.enrolled_host(host), e.encode())
    await store.delete(keys.attested_fact(host))  # a new key: the old attestation no longer counts
    return e


async def enrollment(store: FleetStore, keys: Keys, host: str) -> Enrollment | None:
    got = await store.get(keys.enrolled_host(check_host(host)))
    return None if got is None else Enrollment.decode(got.key, got.value)


class Attestor:
    """The control plane's side: challenge, wait for the answer, verify, record."""

    def __init__(self, store: FleetStore, keys: Keys, by: str, *, timeout: float = ANSWER_TIMEOUT) -> None:
        self.store, self.keys, self.by, self.timeout = store, keys, by, timeout

    async def attest(self, host: str) -> AttestedFact:
        """A fresh attestation of `host`, recorded either way; AttestationError when refused
        (not enrolled, no answer in time, or a quote that fails a check)."""
        enrolled = await enrollment(self.store, self.keys, host)
        if enrolled is None:
            raise AttestationError(f"host `{host}` is not enrolled: run `policyc agent enroll --host {host} …` with its attestation key")
        nonce = secrets.token_bytes(32)
        tag = nonce[:16].hex()
        lease = await self.store.grant(int(self.timeout) + 5)
        try:
            await self.store.put(self.keys.challenge(host, tag), json.dumps(
                {"nonce": nonce.hex(), "pcrs": selection_text(enrolled.pcrs), "by": self.by, "time": time.time(),
                 "lease": lease}).encode(), lease)
            try:
                answer = await self._answer(host, tag, nonce)
                facts = verify_quote(enrolled.key, qualifying_data(nonce, answer.facts), answer.quote, enrolled.pcrs,
                                     enrolled.reference)
                addresses = _addresses(host, answer.facts)
            except AttestationError as e:
                await self._record(AttestedFact(host, False, time.time(), enrolled.key.name.hex(), verified_by=self.by, why=str(e)))
                raise
        finally:
            try:
                await self.store.revoke(lease)  # the challenge goes with it: its nonce is spent
            except StoreError:
                pass
        signed_hw = (answer.facts or {}).get("hardware")
        fact = AttestedFact(host, True, time.time(), enrolled.key.name.hex(), facts.pcrs, self.by, addresses=addresses,
                            hardware=signed_hw if isinstance(signed_hw, dict) else None,
                            report_key=str((answer.facts or {}).get("report_key") or "")[:128])
        await self._record(fact)
        return fact

    async def _answer(self, host: str, tag: str, nonce: bytes) -> Answer:
        key, want = self.keys.quote_answer(host, tag), nonce.hex()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            got: Entry | None = await self.store.get(key)
            if got is not None:
                answer = decode_answer(key, got.value)
                if answer.nonce_hex == want:
                    return answer
            await asyncio.sleep(0.05)
        raise AttestationError(f"host `{host}`: its agent did not answer the challenge within {self.timeout:g} s "
                               "(is `policyc agent run` up there, with its TPM?)")

    async def _record(self, fact: AttestedFact) -> None:
        await self.store.put(self.keys.attested_fact(fact.host), fact.encode())


def _addresses(host: str, facts: dict[str, object] | None) -> tuple[str, ...]:
    """The routable addresses of the (now verified) facts; AttestationError when they are
    another host's facts or not facts at all."""
    if facts is None:
        return ()
    from .host_facts import HostFacts

    try:
        parsed = HostFacts.from_json(facts)
    except ValueError as e:
        raise AttestationError(f"host `{host}`: the facts signed with its quote are not host facts ({e})") from None
    if parsed.host != host:
        raise AttestationError(f"host `{host}`: its quote carries the facts of host `{parsed.host}`")
    return tuple(sorted(parsed.routable()))


class AttestationBook:
    """A replica's view of `attest/` (kept by its watch) and the registration rule."""

    def __init__(self, keys: Keys, max_age: float) -> None:
        self.keys, self.max_age = keys, max_age
        self.enrolled: dict[str, Enrollment] = {}
        self.facts: dict[str, AttestedFact] = {}

    def load(self, entries: tuple[Entry, ...]) -> list[str]:
        """The whole `attest/` prefix (join, reload); returns the records refused."""
        self.enrolled.clear()
        self.facts.clear()
        return [p for e in entries if (p := self._apply(ChangeKind.PUT, e.key, e.value))]

    def on_change(self, ch: Change) -> str:
        """One change under `attest/`; returns a problem with its record ("" when none)."""
        return self._apply(ch.kind, ch.key, ch.value)

    def _apply(self, kind: ChangeKind, key: str, value: bytes) -> str:
        k = self.keys
        try:
            if key.startswith(k.enrolled_hosts):
                host = key[len(k.enrolled_hosts):]
                self.enrolled.pop(host, None)
                if kind is ChangeKind.PUT:
                    self.enrolled[host] = Enrollment.decode(key, value)
            elif key.startswith(k.attested_facts):
                host = key[len(k.attested_facts):]
                self.facts.pop(host, None)
                if kind is ChangeKind.PUT:
                    self.facts[host] = AttestedFact.decode(key, value)
        except AttestationError as e:
            return str(e)  # a record that does not parse counts for nothing
        return ""

    @property
    def active(self) -> bool:
        """Whether the fleet attests TPMs: once any host is enrolled."""
        return bool(self.enrolled)

    def attested(self, host: str, now: float | None = None) -> AttestedFact | None:
        """The host's last attestation, if it succeeded within `max_age`."""
        f = self.facts.get(host)
        if f is None or not f.attested or host not in self.enrolled:
            return None
        if f.ak_name != self.enrolled[host].key.name.hex():
            return None  # made with a key since replaced
        return f if (now or time.time()) - f.time <= self.max_age else None

    def tpm_problem(self, host: str, claims_tpm: bool) -> str:
        """Why a `tpm` claim on `host` is not trusted ("" when it is, or none is made)."""
        if not claims_tpm or not self.active:
            return ""
        if host not in self.enrolled:
            return (f"`deployment.tpm` is true but host `{host}` has no enrolled attestation key; this fleet trusts TPM "
                    f"facts only as attested (`policyc agent enroll --host {host}`, then `policyc agent run` there)")
        f = self.facts.get(host)
        if self.attested(host) is not None:
            return ""
        if f is None:
            return f"`deployment.tpm` is true but host `{host}` has not been attested yet (its agent has answered no challenge)"
        if not f.attested:
            return f"`deployment.tpm` is true but host `{host}`'s attestation was refused: {f.why}"
        return (f"`deployment.tpm` is true but host `{host}`'s last attestation is {time.time() - f.time:.0f} s old "
                f"(at most {self.max_age:g} s), or was made with a key since replaced")
