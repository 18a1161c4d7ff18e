"""Lower `request` (header mappings) and `tenants` blocks.

What happens to a request whose header is missing or malformed is declared by the author,
never implicit: every header states `missing: reject | ignore | default` (with `default:`)
and `malformed: reject | ignore`.
"""

from __future__ import annotations

from typing import cast

from policyc.dsl import ast
from policyc.dsl.diagnostics import Diagnostic, error

from .attributes import BUILTIN_REQUEST_VARS
from .bundle import HeaderMapping, Interval, OnMalformed, OnMissing, Tenant, ValueType
from .fields import BOOL_WORDS, BlockReader, ref, shape
from .value_types import HEADER_TYPES, Kind, kind_of, takes_range, takes_values


def lower_request(block: ast.Block, diags: list[Diagnostic]) -> list[HeaderMapping]:
    if block.labels:
        diags.append(error("E207", "a request block takes no name: `request { header X-… { … } }`", block.labels[0].span))
    r = BlockReader(block, "`request`", diags, fields=(), blocks=("header",))
    return [h for b in r.blocks.get("header", []) if (h := _header(b, diags)) is not None]


def _header(block: ast.Block, diags: list[Diagnostic]) -> HeaderMapping | None:
    if len(block.labels) != 1:
        diags.append(error("E207", "a header mapping is written `header X-Name { var: … type: … }`", block.kind_span))
        return None
    header = block.labels[0].text
    n_before = len(diags)
    r = BlockReader(block, f"header `{header}`", diags,
                    fields=("var", "type", "range", "values", "missing", "default", "malformed"))
    var = r.name("var", required=True)
    vtype = r.name("type", HEADER_TYPES, required=True)
    on_missing = r.name("missing", ("reject", "ignore", "default"), required=True)
    on_malformed = r.name("malformed", ("reject", "ignore"), required=True)
    rng: Interval | None = None
    if vtype is not None and takes_range(vtype):
        rng = r.interval("range", vtype) if "range" in r.fields else None
    elif "range" in r.fields:
        r.err("E316", f"`range` applies to quantities, and `{header}` is of type `{vtype}`", r.fields["range"].key_span)
    values = r.names("values") or ()
    if values and not (vtype is not None and takes_values(vtype)):
        r.err("E316", f"`values` applies to headers of type `name`, and `{header}` is of type `{vtype}`", r.fields["values"].key_span)
    default = None
    dv = r.single("default")
    if on_missing == "default":
        if dv is None:
            r.err("E204", f"header `{header}` says `missing: default` but gives no `default`", r.fields["missing"].span,
                  "add `default: …`")
        elif vtype is not None:
            default = _typed_literal(dv, vtype, "default", r)
            if default is not None and values and default not in values:
                r.err("E310", f"default `{default}` is not one of the header's `values`", dv.span)
    elif dv is not None:
        r.err("E210", "`default` is only used with `missing: default`", r.fields["default"].key_span)
    if var in BUILTIN_REQUEST_VARS and var != "tenant":
        r.err("E401", f"`{var}` is computed by policyc and cannot be fed by a header", r.fields["var"].values[0].span)
    if len(diags) > n_before or var is None or vtype is None or on_missing is None or on_malformed is None:
        return None
    # the three are among their allowed words (read with `names(..., allowed)` above); pydantic checks again
    return HeaderMapping(header=header, var=var, type=cast(ValueType, vtype), range=rng, values=values,
                         on_missing=cast(OnMissing, on_missing), default=default,
                         on_malformed=cast(OnMalformed, on_malformed), origin=ref(block.span))


def _typed_literal(v: ast.Value, vtype: str, key: str, r: BlockReader):
    kind = kind_of(vtype)
    if kind is Kind.FLAG:
        if isinstance(v, ast.Name) and v.dotted in BOOL_WORDS:
            return BOOL_WORDS[v.dotted]
        r.err("E313", f"`{key}` expects yes or no, found {shape(v)}", v.span)
        return None
    if kind is Kind.NAME:
        return r.name_value(v, key)
    if kind is Kind.TEXT:
        return r.string_value(v, key)
    return r.quantity_value(v, key, vtype)


def lower_tenants(block: ast.Block, diags: list[Diagnostic]) -> list[Tenant]:
    """`tenants { acme-bank: finance  st-marys: healthcare }`."""
    r = BlockReader(block, "`tenants`", diags, fields=[f.key for f in block.fields()])
    out = []
    for key, f in r.fields.items():
        cls = r.name(key)
        if cls is not None:
            out.append(Tenant(name=key, tenant_class=cls, origin=ref(f.span)))
    return out
