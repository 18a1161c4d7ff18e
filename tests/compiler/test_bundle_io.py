"""Loading refuses tampered, foreign-schema, unsigned and wrongly signed bundles."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from policyc.compiler import bundle_io
from policyc.compiler.bundle_io import BundleError
from policyc.compiler.pipeline import compile_paths


@pytest.fixture(scope="module")
def bundle(repo_root=None):
    from policy_text import REPO

    result = compile_paths([REPO / "policies"])
    assert result.ok
    return result.bundle


def test_roundtrip(bundle):
    again = bundle_io.loads(bundle_io.dumps(bundle))
    assert again == bundle


def test_edited_value_is_refused(bundle):
    raw = json.loads(bundle_io.dumps(bundle))
    raw["contracts"][0]["compute"]["flops"]["hi"] *= 0.5
    with pytest.raises(BundleError, match="does not match its hash"):
        bundle_io.loads(json.dumps(raw))


def test_reformatting_keeps_identity(bundle):
    raw = json.loads(bundle_io.dumps(bundle))
    assert bundle_io.loads(json.dumps(raw, indent=4)) == bundle


def test_foreign_schema_version(bundle):
    raw = json.loads(bundle_io.dumps(bundle))
    raw["schema_version"] = "policyc.bundle/v0"
    with pytest.raises(BundleError, match="unsupported bundle schema `policyc.bundle/v0`"):
        bundle_io.loads(json.dumps(raw))


def test_schema_violation_names_the_field(bundle):
    raw = json.loads(bundle_io.dumps(bundle))
    del raw["contracts"][0]["memory"]
    with pytest.raises(BundleError, match=r"contracts\.0\.memory"):
        bundle_io.loads(json.dumps(raw))


def test_not_json():
    with pytest.raises(BundleError, match=r"<bundle>:1:1: not a bundle: invalid JSON"):
        bundle_io.loads("contract x {")


def test_signed_bundle_verifies_and_wrong_key_is_refused(bundle):
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signed = bundle_io.sign(bundle, key)
    text = bundle_io.dumps(signed)
    assert bundle_io.loads(text, public_key=key.public_key()).signature is not None
    with pytest.raises(BundleError, match="signature does not verify"):
        bundle_io.loads(text, public_key=other.public_key())


def test_unsigned_bundle_refused_when_a_key_is_given(bundle):
    with pytest.raises(BundleError, match="not signed"):
        bundle_io.loads(bundle_io.dumps(bundle), public_key=Ed25519PrivateKey.generate().public_key())


def test_signature_cannot_be_moved_to_another_bundle(bundle):
    key = Ed25519PrivateKey.generate()
    signed = json.loads(bundle_io.dumps(bundle_io.sign(bundle, key)))
    signed["rules"] = signed["rules"][:-1]
    forged = bundle_io.seal(bundle_io.Bundle.model_validate({**signed, "signature": None}))
    raw = json.loads(bundle_io.dumps(forged))
    raw["signature"] = signed["signature"]
    with pytest.raises(BundleError, match="signature does not verify"):
        bundle_io.loads(json.dumps(raw), public_key=key.public_key())


def test_the_file_form_is_the_full_dump_whether_or_not_the_seal_data_is_reused(bundle):
    """`dumps` reuses the data a bundle was just sealed or signed from; the text must be what
    dumping the whole bundle gives, for that bundle and for any other."""
    import msgspec

    def full(b):
        return msgspec.json.format(msgspec.json.encode(b.model_dump(mode="json"), order="sorted"), indent=2).decode() + "\n"

    sealed = bundle_io.seal(bundle)
    signed = bundle_io.sign(bundle, Ed25519PrivateKey.generate())
    other = sealed.model_copy(update={"compiler_version": "0.0.0-other"})  # not sealed here: no reuse
    for b in (sealed, signed, other, bundle):
        assert bundle_io.dumps(b) == full(b)
    assert bundle_io.canonical_bytes(other) != bundle_io.canonical_bytes(sealed)
    assert bundle_io.loads(bundle_io.dumps(signed)) == signed


def test_loading_entity_by_entity_gives_what_one_call_gives(bundle):
    """`loads` validates and dumps the entity lists one entity at a time (so a reload in a
    worker thread never holds the interpreter lock for long); the bundle and the hashed
    data must be exactly what one pydantic call gives, and errors keep their location."""
    raw = json.loads(bundle_io.dumps(bundle))
    assert bundle_io._validate(raw) == bundle_io.Bundle.model_validate(raw)
    assert bundle_io._payload_by_item(bundle) == bundle.model_dump(mode="json", exclude={"content_hash", "signature"})
    raw["contracts"][1]["compute"]["tokens"] = "many"
    with pytest.raises(BundleError, match=r"invalid bundle at `contracts\.1\.compute\.tokens`"):
        bundle_io.loads(json.dumps(raw))


def test_a_rehashed_bundle_the_compiler_would_refuse_is_refused(bundle):
    c0 = bundle.contracts[0]
    bad = bundle.model_copy(update={"contracts": (c0.model_copy(update={"compute": c0.compute.model_copy(update={"efficiency": -1.0})}),)
                                    + bundle.contracts[1:]})
    with pytest.raises(BundleError, match=r"bundle refused: .*error\[E305\]: `efficiency`"):
        bundle_io.loads(bundle_io.dumps(bundle_io.seal(bad)))


def test_a_large_float_is_canonical_and_its_bundle_loads(bundle):
    """v4: the canonical bytes are msgspec's (`1e16`, no `+`); a bundle holding such a value
    seals, writes and loads back with its hash."""
    big = bundle.model_copy(update={"compiler_version": "x"})
    sealed = bundle_io.seal(big)
    text = bundle_io.dumps(sealed)
    assert bundle_io.loads(text) == sealed
    assert bundle_io._encode({"v": 1e16, "w": 2.5e-7, "n": 2**70}) == b'{"n":1180591620717411303424,"v":1e16,"w":2.5e-7}'


@pytest.mark.parametrize(("text", "where", "why"), [
    ('{"a": NaN}', "1:7", "`NaN` is not a JSON number"),
    ('{\n  "a": 1,\n}', "3:1", "trailing comma in object"),
    ('{"a": Infinity}', "1:7", "`Infinity` is not a JSON number"),
])
def test_invalid_json_is_located(text, where, why):
    with pytest.raises(BundleError) as e:
        bundle_io.loads(text)
    assert str(e.value) == f"<bundle>:{where}: not a bundle: invalid JSON ({why})"
