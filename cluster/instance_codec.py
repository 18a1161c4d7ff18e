"""An instance as the store keeps it: JSON of the instance and its score, if one was given."""

from __future__ import annotations

import json

from pydantic import ValidationError

from policyc.matcher import Instance


class InstanceCodecError(ValueError):
    pass


def encode(instance: Instance, score: float | None = None) -> bytes:
    body: dict[str, object] = {"instance": instance.model_dump(mode="json")}
    if score is not None:
        body["score"] = score
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode(key: str, raw: bytes) -> tuple[Instance, float | None]:
    """The instance and score at `key`; InstanceCodecError names the key and the problem."""
    try:
        body = json.loads(raw)
        inst = Instance.model_validate(body["instance"])
        score = body.get("score")
        return inst, None if score is None else float(score)
    except (ValueError, KeyError, TypeError, ValidationError) as e:
        raise InstanceCodecError(f"{key}: not an instance record ({str(e).splitlines()[0]})") from None
