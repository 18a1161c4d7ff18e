"""The contract embedded in a model: canonical JSON and its sha256 in `metadata_props`.

The model developer ships one file; the contract travels inside it, so the model and the
promise about its cost cannot be separated or silently swapped. The canonical form is the
bundle's (compact JSON, sorted keys over `Contract.model_dump(mode="json")`); the hash lets
the loader tell a corrupted or hand-edited value from a genuine one. Existing properties
are kept: `onnx.helper.set_model_props` would replace them all.
"""

from __future__ import annotations

import hashlib
import json
from typing import Final

import onnx
from pydantic import ValidationError

from policyc.compiler.bundle import Contract
from policyc.compiler.check_values import check_values
from policyc.compiler.diagnostic import Diagnostic

from .errors import ContractMetadataError, ModelFileError
from .model_file import ModelSource, read_model, source_name

CONTRACT_KEY: Final = "policyc.contract"
HASH_KEY: Final = "policyc.contract.sha256"
REQUIRED_SECTIONS: Final = ("compute", "memory", "dependencies")
MAX_CONTRACT_CHARS: Final = 1024 * 1024


def canonical_json(contract: Contract) -> str:
    return json.dumps(contract.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def contract_hash(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def embed_contract(model: onnx.ModelProto, contract: Contract) -> onnx.ModelProto:
    """A copy of `model` carrying `contract`, other metadata properties kept in order."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    text = canonical_json(contract)
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in (CONTRACT_KEY, HASH_KEY)]
    del out.metadata_props[:]
    for key, value in [*kept, (CONTRACT_KEY, text), (HASH_KEY, contract_hash(text))]:
        out.metadata_props.add(key=key, value=value)
    return out


def _field_path(loc: tuple[object, ...]) -> str:
    return ".".join(str(p) for p in loc)


def _schema_error(origin: str, err: ValidationError) -> ContractMetadataError:
    problems = err.errors()
    # Missing required sections first: they are what an author most needs to hear about.
    problems.sort(key=lambda p: (p["type"] != "missing", len(p["loc"])))
    first = problems[0]
    where = _field_path(first["loc"])
    if first["type"] == "missing":
        kind = "section" if where in REQUIRED_SECTIONS else "field"
        msg = f"{origin}: embedded contract is incomplete: missing required {kind} `{where}`"
    else:
        msg = f"{origin}: embedded contract does not match the schema at `{where}`: {first['msg']}"
    if len(problems) > 1:
        others = ", ".join(f"`{_field_path(p['loc'])}`" for p in problems[1:6])
        msg += f" (also: {others})"
    return ContractMetadataError(msg, field=where)


def _semantic_problems(c: Contract) -> list[tuple[str, str]]:
    """Values the schema admits but no scheduler can use."""
    out: list[tuple[str, str]] = []
    f = c.compute.flops
    if not (f.lo > 0 and f.hi > 0):
        out.append(("compute.flops", f"FLOPs interval must be positive, got [{f.lo:g}, {f.hi:g}]"))
    elif f.lo > f.hi:
        out.append(("compute.flops", f"FLOPs interval is empty: lo {f.lo:g} > hi {f.hi:g}"))
    if c.compute.tokens <= 0:
        out.append(("compute.tokens", f"token count must be positive, got {c.compute.tokens}"))
    if not c.memory.bandwidth_min > 0:
        out.append(("memory.bandwidth_min", f"memory bandwidth must be positive, got {c.memory.bandwidth_min:g} B/s"))
    if not c.memory.burst_max > 0:
        out.append(("memory.burst_max", f"memory burst duration must be positive, got {c.memory.burst_max:g} s"))
    return out


def parse_contract(text: str, recorded_hash: str | None, origin: str) -> Contract:
    """Verify and parse an embedded contract value; errors name the key or field."""
    if recorded_hash is None:
        raise ContractMetadataError(f"{origin}: metadata `{HASH_KEY}` is missing: the contract cannot be verified", field=HASH_KEY)
    actual = contract_hash(text)
    if recorded_hash != actual:
        raise ContractMetadataError(
            f"{origin}: metadata `{CONTRACT_KEY}` does not match `{HASH_KEY}` (recorded {recorded_hash}, "
            f"computed {actual}): the contract was modified or corrupted after embedding",
            field=CONTRACT_KEY,
        )
    if len(text) > MAX_CONTRACT_CHARS:
        raise ContractMetadataError(f"{origin}: metadata `{CONTRACT_KEY}` is {len(text):,} characters; at most "
                                    f"{MAX_CONTRACT_CHARS:,} are read", field=CONTRACT_KEY)
    try:
        raw = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as e:
        raise ContractMetadataError(
            f"{origin}: metadata `{CONTRACT_KEY}` is not valid JSON at column {e.colno}: {e.msg}", field=CONTRACT_KEY
        ) from None
    except (ValueError, RecursionError) as e:  # NaN / Infinity, a 5,000-digit integer, nesting
        raise ContractMetadataError(f"{origin}: metadata `{CONTRACT_KEY}` is not a contract: {str(e).split(';')[0]}",
                                    field=CONTRACT_KEY) from None
    if not isinstance(raw, dict):
        raise ContractMetadataError(f"{origin}: metadata `{CONTRACT_KEY}` must be a JSON object", field=CONTRACT_KEY)
    try:  # strict: a token count written as a string is refused, as the compiler would never write one
        contract = Contract.model_validate_json(text, strict=True)
    except ValidationError as e:
        raise _schema_error(origin, e) from None
    bad = _semantic_problems(contract)
    if bad:
        field, why = bad[0]
        raise ContractMetadataError(f"{origin}: embedded contract has a bad `{field}`: {why}", field=field)
    # then exactly the compiler's own value checks (precision, efficiency, finite values, cuda bounds ...)
    diags: list[Diagnostic] = []
    check_values([contract], (), (), (), (), diags)
    if diags:
        d = diags[0]
        more = f" (and {len(diags) - 1} more)" if len(diags) > 1 else ""
        raise ContractMetadataError(f"{origin}: embedded contract refused: error[{d.code}]: {d.message}{more}",
                                    field=CONTRACT_KEY)
    return contract


def _not_a_number(name: str) -> float:
    raise ValueError(f"`{name}` is not a JSON number")


def contract_from_model(model: onnx.ModelProto, origin: str) -> Contract:
    props: dict[str, str] = {}
    for p in model.metadata_props:
        if p.key in props and p.key in (CONTRACT_KEY, HASH_KEY):
            raise ContractMetadataError(f"{origin}: metadata key `{p.key}` appears more than once", field=p.key)
        props[p.key] = p.value
    if CONTRACT_KEY not in props:
        raise ContractMetadataError(
            f"{origin}: no embedded contract: metadata `{CONTRACT_KEY}` is missing (embed one with `policyc embed`)",
            field=CONTRACT_KEY,
        )
    return parse_contract(props[CONTRACT_KEY], props.get(HASH_KEY), origin)


def load_contract(source: ModelSource) -> Contract:
    """The verified contract embedded in an ONNX model (path or bytes).

    Raises ContractMetadataError (with `.field`) for a missing, corrupted or incomplete
    contract; for bytes or a file that is not an ONNX model, `.field` is `model`.
    """
    try:
        model = read_model(source)
    except ModelFileError as e:
        # An unreadable model has no contract; callers that register instances catch one type.
        raise ContractMetadataError(str(e), field="model") from None
    return contract_from_model(model, source_name(source))
