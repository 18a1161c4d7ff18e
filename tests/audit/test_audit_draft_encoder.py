"""The writer's direct draft encoder writes exactly the bytes the pydantic path writes, and
hands every draft its strict schema refuses back to pydantic (returns None)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from audit_helpers import decision

from policyc.audit.draft_encoder import encode_draft
from policyc.audit.records import DecisionRecord
from policyc.audit.redaction import DEFAULT_REDACT, Redactor

REDACTOR = Redactor(DEFAULT_REDACT)
TEXTS = ["", "plain", "ünïcødé ☃ 𝄞", 'quote " back \\ slash', "ctl \x00\x01\x1f\x7f\n\t\r\b\f", "\u2028\u2029", "é" * 40]


def _pydantic_bytes(draft: dict[str, Any]) -> bytes:
    record = DecisionRecord.model_validate(draft)
    return REDACTOR.dump(record, record.request).encode()


def _fast_bytes(draft: dict[str, Any]) -> bytes:
    encoded = encode_draft(draft)
    assert encoded is not None, draft
    headers = draft.get("request", {})
    return REDACTOR.redact_json(encoded.decode(), headers).encode() if REDACTOR.secrets(headers) else encoded


def _float(rng: random.Random, low: float = -30) -> float:
    return rng.choice([0.0, 1.0, 1e-5, 5.5e-5, 1e-6, 1e16, 1e15, 0.5]) if rng.random() < 0.2 else rng.random() * 10 ** rng.uniform(low, 25)


def _random_draft(rng: random.Random, i: int) -> dict[str, Any]:
    secret = f"tok-{i}-{rng.choice(TEXTS)}"
    request = {"X-SLO-Latency": rng.choice(TEXTS), "X-Data-Region": "us-west"}
    if rng.random() < 0.5:
        request["Authorization"] = secret
    d: dict[str, Any] = {
        "time": _float(rng), "decision_id": f"dec-{i}-{rng.choice(TEXTS)}", "tenant": rng.choice(TEXTS),
        "request": request,
        "variables": {"slo": _float(rng), "region": rng.choice(TEXTS + [secret]), "tpm": rng.random() < 0.5},
        "bundle_hash": "sha256:" + "ab" * 32, "outcome": rng.choice(["admitted", "rejected", "failed"]),
        "matched_rules": [{"id": "p.r", "origin": {"file": rng.choice(TEXTS), "line": rng.randrange(10**6), "col": 3}}] * rng.randrange(3),
        "latency": {"total": _float(rng), "stages": {"match": _float(rng), "place": _float(rng)}},
    }
    if rng.random() < 0.7:
        d["schema_version"] = "policyc.audit.decision/v1"
    for key, value in (("model", rng.choice(TEXTS)), ("reason", f"refused: {secret}")):
        choice = rng.random()
        if choice < 0.4:
            d[key] = value
        elif choice < 0.7:
            d[key] = None
    if rng.random() < 0.7:
        d["placement"] = {"instance": "i-1", "host": None, "gpu": rng.choice(TEXTS), "region": "eu",
                          "share": rng.choice([None, 1.0, 0.25, 1e-7]), "predicted_latency": rng.choice([None, _float(rng)])}
    if rng.random() < 0.8:
        fig = {"value": _float(rng), "source": rng.choice(["measured", "estimated"]), "method": "contract",
               "low": rng.choice([None, _float(rng)]), "high": _float(rng)}
        d["resources"] = {"gpu_seconds": fig, "memory_bytes": None, "network_bytes": dict(fig, low=None, high=None)}
    return d


def test_canonical_drafts_encode_to_the_pydantic_bytes() -> None:
    rng = random.Random(7)
    drafts = [decision(i).model_dump(mode="json") for i in range(20)] + [_random_draft(rng, i) for i in range(600)]
    for draft in drafts:
        assert _fast_bytes(draft) == _pydantic_bytes(draft)


def test_minimal_draft_gets_the_defaults_pydantic_writes() -> None:
    draft = {"time": 1.5, "decision_id": "d", "tenant": "t", "bundle_hash": "h", "outcome": "failed", "latency": {"total": 0.0}}
    assert _fast_bytes(draft) == _pydantic_bytes(draft)
    assert b'"request":{}' in _fast_bytes(draft) and b'"resources":{}' in _fast_bytes(draft)


def _with(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    draft = decision(1).model_dump(mode="json")
    target = draft
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return draft


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("time",), 1700000000),  # an int where a float is declared: pydantic coerces
        (("time",), float("inf")),
        (("time",), True),
        (("outcome",), "maybe"),
        (("outcome",), ["admitted"]),
        (("decision_id",), ""),
        (("schema_version",), "policyc.audit.decision/v0"),
        (("unknown",), 1),
        (("variables", "n"), 3),
        (("latency", "total"), -1.0),
        (("latency", "stages"), None),
        (("placement", "share"), 0.0),
        (("placement", "share"), 1.5),
        (("placement", "extra"), "x"),
        (("resources", "gpu_seconds", "source"), "guessed"),
        (("resources", "gpu_seconds", "value"), -0.5),
        (("resources",), None),
        (("matched_rules",), [{"id": "p.r"}]),
        (("matched_rules",), [{"id": "p.r", "origin": {"file": "f", "line": 1.0, "col": 1}}]),
        (("request", "X-Num"), 5),
    ],
)
def test_other_drafts_go_to_pydantic_or_give_its_bytes(path: tuple[str, ...], value: Any) -> None:
    draft = _with(path, value)
    encoded = encode_draft(draft)
    try:
        expected = _pydantic_bytes(draft)
    except ValueError:  # pydantic refuses it: the fast path must not have accepted it
        assert encoded is None
    else:
        assert encoded is None or REDACTOR.redact_json(encoded.decode(), draft["request"]).encode() == expected


def test_missing_required_field_goes_to_pydantic() -> None:
    draft = decision(1).model_dump(mode="json")
    del draft["latency"]
    assert encode_draft(draft) is None
    assert encode_draft(["not", "a", "dict"]) is None


def test_rule_in_another_key_order_and_unencodable_text() -> None:
    draft = decision(1).model_dump(mode="json")
    draft["matched_rules"] = [{"origin": {"file": "f", "line": 1, "col": 1}, "id": "p.r"}]
    assert _fast_bytes(draft) == _pydantic_bytes(draft)  # written in the model's order
    assert _pydantic_bytes(draft).count(b'"id":"p.r","origin"') == 1
    assert encode_draft(_with(("tenant",), "half \ud800 surrogate")) is None


def test_strict_schema_mirrors_the_record_models_field_for_field() -> None:
    """The encoder's schema is written by hand: a field added to, removed from, moved in or
    made optional in a record model must be mirrored there, or this fails."""
    from policyc.audit import draft_encoder as enc
    from policyc.audit.records import Figure, Latency, MatchedRule, Placement, Resources
    from policyc.compiler.bundle import SourceRef

    pairs = [(DecisionRecord, enc._DECISION), (Figure, enc._FIGURE), (SourceRef, enc._ORIGIN), (MatchedRule, enc._RULE),
             (Placement, enc._PLACEMENT), (Latency, enc._LATENCY), (Resources, enc._RESOURCES)]
    for model, schema in pairs:
        fields = schema["fields"]
        assert list(fields) == list(model.model_fields), model.__name__
        assert {k: f["required"] for k, f in fields.items()} == {k: f.is_required() for k, f in model.model_fields.items()}, model.__name__
