"""An instance as the store keeps it: JSON of the instance, its score if one was given, and
which of its facts were attested at registration."""

from __future__ import annotations

import json

from pydantic import ValidationError

from policyc.matcher import Instance


class InstanceCodecError(ValueError):
    pass


def encode(instance: Instance, score: float | None = None, attested: dict[str, str] | None = None) -> bytes:
    """`attested`: the facts of the instance that were attested when it was registered, and
    by what (`{"tpm": <attestation key name>}`), recorded beside it for auditors."""
    body: dict[str, object] = {"instance": instance.model_dump(mode="json")}
    if score is not None:
        body["score"] = score
    if attested:
        body["attested"] = dict(sorted(attested.items()))
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def attested(raw: bytes) -> dict[str, str]:
    """The `attested` facts of a stored instance record ({} when none, or not a record)."""
    try:
        got = json.loads(raw).get("attested") or {}
        return {str(k): str(v) for k, v in got.items()}
    except (ValueError, AttributeError, TypeError):
        return {}


def decode(key: str, raw: bytes) -> tuple[Instance, float | None]:
    """The instance and score at `key`; InstanceCodecError names the key and the problem."""
    try:
        body = json.loads(raw)
        inst = Instance.model_validate(body["instance"])
        score = body.get("score")
        return inst, None if score is None else float(score)
    except (ValueError, KeyError, TypeError, ValidationError) as e:
        raise InstanceCodecError(f"{key}: not an instance record ({str(e).splitlines()[0]})") from None


def record(key: str, raw: bytes) -> tuple[str, object, object]:
    """(key, instance record, score or None) for `InstanceBatch.from_records`, which checks
    the record's fields; InstanceCodecError when `raw` is not a stored instance at all."""
    try:
        body = json.loads(raw)
    except ValueError as e:
        raise InstanceCodecError(f"{key}: not an instance record (not JSON: {e})") from None
    if type(body) is not dict or "instance" not in body:
        raise InstanceCodecError(f"{key}: not an instance record (no `instance` field)")
    return key, body["instance"], body.get("score")
