"""Canonical bytes, content hash, signing, and verified loading of bundles.

Same input → same bytes: the canonical form is compact JSON with sorted keys, written by
msgspec (floats as the shortest text that reads back to the same value, exponents without
`+`, UTF-8 as is, integers of any size). The file on disk is the same JSON indented for
people; the hash is always taken over the compact form, so reformatting a bundle file does
not change its identity but editing any value does. A compiled encoder because a
10,000-contract bundle is 35 MB of JSON: the standard library's encoder took ~1 s to seal
it and ~4 s to indent it. msgspec is the project's one JSON library beside pydantic (issue
41; it replaced orjson, whose canonical bytes differed only in exponents: `1e+16`, hence
bundle schema v4): measured here on a 28.6 MB payload, msgspec 0.12 s compact and 0.30 s
indented (orjson 0.09 s and 0.17 s), reading 1.17 s (orjson 1.37 s).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import get_args, get_origin

import msgspec

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from pydantic import BaseModel, ValidationError

from . import limits

from . import bounded_read
from .bundle import SCHEMA_VERSION, Bundle, Signature
from .gc_pause import gc_paused
from .revalidate import check_bundle


class BundleError(Exception):
    """A bundle that cannot be trusted or read; the message names the place and problem."""


# The last bundle sealed or signed here, with the plain data its hash was taken over. A
# bundle is frozen all the way down, so the same object always has the same data: writing
# the bundle just compiled reuses it instead of dumping 10,000 contracts a second time.
_sealed: tuple[Bundle, dict] | None = None


def _payload(bundle: Bundle) -> dict:
    """Everything but hash and signature, as JSON-ready data."""
    last = _sealed
    if last is not None and last[0] is bundle:
        return last[1]
    return bundle.model_dump(mode="json", exclude={"content_hash", "signature"})


def canonical_bytes(bundle: Bundle) -> bytes:
    return _encode(_payload(bundle))


def _encode(data: dict, *, indent: bool = False) -> bytes:
    """Compact JSON with sorted keys (indented by two spaces for the file form). msgspec
    writes integers of any size, so one path serves all data: the bytes are a function of it."""
    raw = msgspec.json.encode(data, order="sorted")
    return msgspec.json.format(raw, indent=2) if indent else raw


def content_hash(bundle: Bundle) -> str:
    return _digest(_payload(bundle))


def _digest(payload: dict) -> str:
    return "sha256:" + hashlib.sha256(_encode(payload)).hexdigest()


def seal(bundle: Bundle) -> Bundle:
    """Return the bundle with its content hash filled in (and any old signature dropped)."""
    global _sealed
    with gc_paused():  # a large bundle is millions of small acyclic objects
        payload = _payload(bundle)
        digest = _digest(payload)
    sealed = bundle.model_copy(update={"content_hash": digest, "signature": None})
    _sealed = (sealed, payload)
    return sealed


def sign(bundle: Bundle, private_key: Ed25519PrivateKey) -> Bundle:
    global _sealed
    sealed = seal(bundle)
    payload = _payload(sealed)
    pub = private_key.public_key().public_bytes_raw().hex()
    sig = private_key.sign(sealed.content_hash.encode()).hex()
    signed = sealed.model_copy(update={"signature": Signature(public_key=pub, value=sig)})
    _sealed = (signed, payload)  # the signature is not part of the hashed data
    return signed


def dumps(bundle: Bundle) -> str:
    """The file form: the canonical JSON, indented, with hash and signature."""
    with gc_paused():
        data = dict(_payload(bundle), content_hash=bundle.content_hash,
                    signature=bundle.signature.model_dump(mode="json") if bundle.signature else None)
        return _encode(data, indent=True).decode() + "\n"


def write(bundle: Bundle, path: str | Path) -> None:
    Path(path).write_text(dumps(bundle), encoding="utf-8")


# The bundle's lists of entities, validated and dumped one entity at a time when loading:
# one pydantic call over 1,400 contracts holds the interpreter lock for ~0.35 s (and the
# dump for the hash as long again), which a reload running in a worker thread would take
# from every Decide on the serving loop; item by item, the loop gets the lock back every
# few milliseconds. The result is the same as one call's (tests/compiler/test_bundle_io.py).
_ITEM_LISTS: dict[str, type[BaseModel]] = {
    name: get_args(f.annotation)[0] for name, f in Bundle.model_fields.items()
    if get_origin(f.annotation) is tuple and isinstance(get_args(f.annotation)[0], type)
    and issubclass(get_args(f.annotation)[0], BaseModel)
}


def _validate(raw: dict) -> Bundle:
    """`Bundle.model_validate(raw)`, entity by entity (errors keep their full location)."""
    parts: dict[str, object] = {}
    for name, model in _ITEM_LISTS.items():
        items = raw.get(name)
        if not isinstance(items, list):
            continue
        out = []
        for i, item in enumerate(items):
            try:
                out.append(model.model_validate(item))
            except ValidationError as e:
                line = [dict(err, loc=(name, i, *err["loc"])) for err in e.errors()]  # type: ignore[misc]
                raise ValidationError.from_exception_data(Bundle.__name__, line) from None  # type: ignore[arg-type]
        parts[name] = out
    return Bundle.model_validate({**raw, **parts})


def _payload_by_item(bundle: Bundle) -> dict:
    """`_payload(bundle)`, dumped entity by entity (see `_ITEM_LISTS`)."""
    data = bundle.model_dump(mode="json", exclude={"content_hash", "signature", *_ITEM_LISTS})
    for name in _ITEM_LISTS:
        data[name] = [item.model_dump(mode="json") for item in getattr(bundle, name)]
    return data


def _json_offset(message: str) -> int | None:
    """The byte offset msgspec's DecodeError names (`… (byte N)`), if any."""
    m = re.search(r"\(byte (\d+)\)$", message)
    return int(m.group(1)) if m else None


def _json_error(text: str, message: str) -> str:
    """`line:col` (1-based) of the byte msgspec's error names; the text's end when none is named."""
    raw = text.encode("utf-8", "surrogatepass")
    at = _json_offset(message)
    head = raw[:len(raw) if at is None else at].decode("utf-8", "replace")
    line = head.count("\n") + 1
    return f"{line}:{len(head) - (head.rfind(chr(10)) + 1) + 1}"


def _json_why(text: str, message: str) -> str:
    """msgspec's words, a NaN or Infinity named as such, without the byte offset."""
    at = _json_offset(message)
    if at is not None:
        rest = text.encode("utf-8", "surrogatepass")[at:at + 9]
        word = next((w for w in ("NaN", "Infinity", "-Infinity") if rest.startswith(w.encode())), None)
        if word:
            return f"`{word}` is not a JSON number"
    why = re.sub(r"\s*\(byte \d+\)$", "", message)
    return why.removeprefix("JSON is malformed: ")


def loads(text: str | bytes, *, origin: str = "<bundle>", public_key: Ed25519PublicKey | None = None) -> Bundle:
    """Parse and verify a bundle: size, JSON, schema version, schema, hash, (when a public
    key is given) an ed25519 signature, and then the compiler's own checks
    (`revalidate.check_bundle`), so that a re-hashed bundle the compiler would refuse never
    loads. Raises BundleError naming what is wrong, never anything else."""
    if len(text) > limits.MAX_BUNDLE_BYTES:
        raise BundleError(f"{origin}: bundle is {len(text):,} bytes; at most {limits.MAX_BUNDLE_BYTES:,} are read")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BundleError(f"{origin}: not a bundle: not UTF-8 text (byte offset {e.start})") from None
    try:  # msgspec: strict JSON (no NaN, no Infinity, no lone surrogates, no trailing commas), faster than json
        raw = msgspec.json.decode(text)
    except msgspec.DecodeError as e:
        raise BundleError(f"{origin}:{_json_error(text, str(e))}: not a bundle: invalid JSON ({_json_why(text, str(e))})") from None
    except RecursionError:
        raise BundleError(f"{origin}: not a bundle: invalid JSON (nested too deeply)") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{origin}: not a bundle: expected a JSON object")
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise BundleError(
            f"{origin}: unsupported bundle schema `{str(version)[:64]}`; this policyc reads `{SCHEMA_VERSION}`"
        )
    try:
        bundle = _validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:200]
        raise BundleError(f"{origin}: invalid bundle at `{where}`: {first['msg']} ({e.error_count()} problem(s))") from None
    except RecursionError:
        raise BundleError(f"{origin}: invalid bundle: nested too deeply") from None
    try:
        expected = _digest(_payload_by_item(bundle))
    except (UnicodeEncodeError, RecursionError, ValueError, TypeError, msgspec.MsgspecError) as e:
        raise BundleError(f"{origin}: invalid bundle: its content cannot be written canonically ({type(e).__name__})") from None
    if bundle.content_hash != expected:
        raise BundleError(
            f"{origin}: bundle content does not match its hash (recorded {bundle.content_hash[:80] or 'none'}, "
            f"computed {expected}): the bundle was modified after compilation"
        )
    if public_key is not None:
        if bundle.signature is None:
            raise BundleError(f"{origin}: bundle is not signed, and a public key was given")
        try:
            public_key.verify(bytes.fromhex(bundle.signature.value), bundle.content_hash.encode())
        except (InvalidSignature, ValueError):
            raise BundleError(f"{origin}: bundle signature does not verify with the given public key") from None
    problems = check_bundle(bundle)
    if problems:
        top = problems[0]
        at = f"{top.span}: " if top.span is not None else ""
        more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise BundleError(f"{origin}: bundle refused: {at}error[{top.code}]: {top.message}{more}; "
                          "the compiler would not have written it")
    return bundle


def load(path: str | Path, *, public_key: Ed25519PublicKey | None = None) -> Bundle:
    """Read (a regular file, bounded: see `bounded_read`) and verify a bundle file."""
    p = Path(path)
    try:
        data = bounded_read.read_bytes(p, limits.MAX_BUNDLE_BYTES, "bundle")
    except bounded_read.FileRefused as e:
        raise BundleError(str(e)) from None
    return loads(data, origin=str(p), public_key=public_key)
