"""The writer's direct draft encoder writes exactly the bytes the pydantic path writes, and
hands every draft its strict structs refuse back to pydantic (returns None); drafts cross
the pipe as MessagePack (`wire_draft`)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from audit_helpers import decision

from policyc.audit.draft_encoder import encode_draft, wire_draft
from policyc.audit.index_columns import index_row
from policyc.audit.records import DecisionRecord
from policyc.audit.redaction import DEFAULT_REDACT, Redactor
from policyc.audit.writer_process import _Drafts

_SERIALISE = _Drafts(DEFAULT_REDACT)


def WRITER(payload: bytes) -> bytes:
    """What the writer process stores for a wire draft; the index columns it derives on
    the fast path must be those `verify` derives from the stored body."""
    body, index = _SERIALISE(payload)
    assert index is None or index == index_row(body), (index, index_row(body))
    return body

REDACTOR = Redactor(DEFAULT_REDACT)
TEXTS = ["", "plain", "ünïcødé ☃ 𝄞", 'quote " back \\ slash', "ctl \x00\x01\x1f\x7f\n\t\r\b\f", "\u2028\u2029", "é" * 40]


def _pydantic_bytes(draft: dict[str, Any]) -> bytes:
    record = DecisionRecord.model_validate(draft)
    return REDACTOR.dump(record, record.request).encode()


def _fast(draft: dict[str, Any]) -> bytes | None:
    """The fast path alone (None: refused, pydantic decides), redacted as the writer does."""
    encoded = encode_draft(wire_draft(draft))
    if encoded is None:
        return None
    body, headers, index = encoded
    assert index == index_row(body)
    return REDACTOR.redact_json(body.decode(), headers).encode() if REDACTOR.secrets(headers) else body


def _fast_bytes(draft: dict[str, Any]) -> bytes:
    encoded = _fast(draft)
    assert encoded is not None, draft
    return encoded


def _float(rng: random.Random, low: float = -30, high: float = 25) -> float:
    special = [x for x in (0.0, 1.0, 1e-5, 5.5e-5, 1e-6, 1e16, 1e15, 0.5) if x < 10**high]
    return rng.choice(special) if rng.random() < 0.2 else rng.random() * 10 ** rng.uniform(low, high)


def _random_draft(rng: random.Random, i: int, *, everyday: bool = False) -> dict[str, Any]:
    """A random draft; `everyday`: complete (every defaulted field present) with floats
    below 1e16, the kind the fast path must take."""
    if everyday:
        d = _random_draft(random.Random(rng.random()), i)
        d.setdefault("schema_version", "policyc.audit.decision/v1")
        d.setdefault("resources", {})
        d["matched_rules"] = [{**r, "origin": {"end_line": 0, "end_col": 0, **r["origin"]}} for r in d["matched_rules"]]
        return _cap_floats(d)
    return _random_draft_any(rng, i)


def _cap_floats(value: Any) -> Any:
    if isinstance(value, float) and value >= 1e16:
        return value / 1e10
    if isinstance(value, dict):
        return {k: _cap_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cap_floats(v) for v in value]
    return value


def _random_draft_any(rng: random.Random, i: int) -> dict[str, Any]:
    secret = f"tok-{i}-{rng.choice(TEXTS)}"
    request = {"X-SLO-Latency": rng.choice(TEXTS), "X-Data-Region": "us-west"}
    if rng.random() < 0.5:
        request["Authorization"] = secret
    d: dict[str, Any] = {
        "time": _float(rng), "decision_id": f"dec-{i}-{rng.choice(TEXTS)}", "tenant": rng.choice(TEXTS),
        "request": request,
        "variables": {"slo": _float(rng), "region": rng.choice(TEXTS + [secret]), "tpm": rng.random() < 0.5},
        "bundle_hash": "sha256:" + "ab" * 32, "outcome": rng.choice(["admitted", "rejected", "failed"]),
        "matched_rules": [{"id": "p.r", "origin": {"file": rng.choice(TEXTS), "line": rng.randrange(10**6), "col": 3,
                                                   **({"end_line": 2, "end_col": 40} if rng.random() < 0.9 else {})}}] * rng.randrange(3),
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
    fast = 0
    for draft in drafts:
        expected = _pydantic_bytes(draft)
        assert WRITER(wire_draft(draft)) == expected  # whichever path the writer takes
        encoded = _fast(draft)
        assert encoded is None or encoded == expected
        fast += encoded is not None
    assert fast >= 100, fast  # the random drafts often lack a defaulted field or have a float >= 1e16
    everyday = drafts[:20] + [_random_draft(rng, i, everyday=True) for i in range(300)]
    for draft in everyday:  # complete drafts with floats below 1e16: all on the fast path
        assert _fast_bytes(draft) == _pydantic_bytes(draft)


def test_large_floats_take_the_slow_path_with_the_same_bytes() -> None:
    draft = decision(1).model_dump(mode="json")
    draft["resources"]["memory_bytes"]["value"] = 2.5e16  # msgspec writes 2.5e16, pydantic 2.5e+16
    assert _fast(draft) is None
    assert WRITER(wire_draft(draft)) == _pydantic_bytes(draft) and b"2.5e+16" in _pydantic_bytes(draft)
    draft["resources"]["memory_bytes"]["value"] = 2.5e-16  # negative exponents are written alike
    assert _fast_bytes(draft) == _pydantic_bytes(draft)


def test_minimal_draft_gets_the_defaults_pydantic_writes() -> None:
    draft = {"time": 1.5, "decision_id": "d", "tenant": "t", "bundle_hash": "h", "outcome": "failed", "latency": {"total": 0.0}}
    assert _fast(draft) is None  # fields with defaults other than None are required on the fast path
    assert WRITER(wire_draft(draft)) == _pydantic_bytes(draft)
    assert b'"request":{}' in _pydantic_bytes(draft) and b'"resources":{}' in _pydantic_bytes(draft)


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
    encoded = _fast(draft)
    try:
        expected = _pydantic_bytes(draft)
    except ValueError:  # pydantic refuses it: the fast path must not have accepted it
        assert encoded is None
    else:
        assert encoded is None or encoded == expected


def test_non_finite_floats_and_bytes_reach_pydantic_as_they_are() -> None:
    """MessagePack keeps inf, nan and bytes: the strict structs refuse them and pydantic
    decides, as it would have for the draft itself."""
    for path, value in ((("placement", "predicted_latency"), float("inf")), (("latency", "stages", "match"), float("nan")),
                        (("request", "X-Data-Region"), b"us-west")):
        draft = decision(1, t=1.7e9).model_dump(mode="json")
        target = draft
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert _fast(draft) is None
        assert WRITER(wire_draft(draft)) == _pydantic_bytes(draft)


def test_missing_required_field_goes_to_pydantic() -> None:
    draft = decision(1).model_dump(mode="json")
    del draft["latency"]
    assert encode_draft(wire_draft(draft)) is None
    with pytest.raises(ValueError, match="latency"):
        WRITER(wire_draft(draft))
    assert encode_draft(wire_draft(["not", "a", "dict"])) is None  # type: ignore[arg-type]
    assert encode_draft(b"\xc1 not msgpack") is None


def test_rule_in_another_key_order_and_unencodable_text() -> None:
    draft = decision(1).model_dump(mode="json")
    draft["matched_rules"] = [{"origin": {"end_col": 9, "file": "f", "line": 1, "col": 1, "end_line": 1}, "id": "p.r"}]
    assert _fast_bytes(draft) == _pydantic_bytes(draft)  # written in the model's order
    assert _pydantic_bytes(draft).count(b'"id":"p.r","origin"') == 1
    with pytest.raises(TypeError, match="only dicts"):
        wire_draft(_with(("tenant",), "half \ud800 surrogate"))  # refused at the call


def test_strict_structs_mirror_the_record_models_field_for_field() -> None:
    """The encoder's structs are written by hand: a field added to, removed from or moved in
    a record model must be mirrored there, or this fails. A field is optional there exactly
    when the model's default is None (other defaults are required, so pydantic writes them)."""
    import msgspec

    from policyc.audit import draft_encoder as enc
    from policyc.audit.records import Figure, Latency, MatchedRule, Placement, Resources
    from policyc.compiler.bundle import SourceRef

    pairs = [(DecisionRecord, enc.DecisionWire), (Figure, enc.FigureWire), (SourceRef, enc.OriginWire), (MatchedRule, enc.RuleWire),
             (Placement, enc.PlacementWire), (Latency, enc.LatencyWire), (Resources, enc.ResourcesWire)]
    for model, struct in pairs:
        fields = {f.name: f for f in msgspec.structs.fields(struct)}
        assert list(fields) == list(model.model_fields), model.__name__
        want = {k: f.is_required() or f.get_default(call_default_factory=True) is not None for k, f in model.model_fields.items()}
        assert {k: f.required for k, f in fields.items()} == want, model.__name__
        assert all(f.default is None for f in fields.values() if not f.required), model.__name__
