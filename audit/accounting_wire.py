"""A call's `accounting` record as its stored bytes, without building pydantic models.

The gateway's access-log receiver makes one accounting record per call on the serving
event loop, the thread that also decides. Building the `ActionRecord` (four pydantic
models, validated) and dumping it cost ~25 µs a call there (measured on the gateway
benchmark's calls); the msgspec structs below write the same JSON in ~2 µs. They mirror
`records.ActionRecord` (the fields an accounting record has), `Resources` and `Figure`
field for field, in the models' order, leaving out what `model_dump_json(exclude_none=True)`
leaves out, so the bytes are the same (the tests compare both on real and random records).

Struct construction does not validate, so `accounting.call_accounting_body` checks what
the models would refuse (negative figures) before it builds one, and hands anything the
structs would write differently (a float of 1e16 or more, which msgspec writes as `1e16`
and pydantic as `1e+16`; a string msgspec cannot encode) to the pydantic path.
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import Struct

from .draft_encoder import FigureWire, ResourcesWire

_LARGE = 1e16  # from here on msgspec and pydantic write a float's exponent differently
_ENCODE = msgspec.json.Encoder().encode


class AccountingWire(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False):
    """`records.ActionRecord` of kind `accounting` (no rule, no origin: absent from its body)."""

    schema_version: Literal["policyc.audit.action/v1"]
    time: float
    kind: Literal["accounting"]
    target: str
    outcome: Literal["done"]
    dry_run: bool
    decision_id: str
    detail: str
    resources: ResourcesWire
    trace_id: str | None = None  # a traced call's (omitted when None, as the model's body omits it)


def accounting_json(decision_id: str, time: float, target: str, detail: str, network: FigureWire,
                    compute: FigureWire | None, trace_id: str | None = None) -> bytes | None:
    """The stored body of an accounting record with these (already checked) parts, or None
    when pydantic must write it (see the module's docstring)."""
    if not (-_LARGE < time < _LARGE and network.value < _LARGE and (compute is None or compute.value < _LARGE)):
        return None
    record = AccountingWire(schema_version="policyc.audit.action/v1", time=time, kind="accounting", target=target,
                            outcome="done", dry_run=False, decision_id=decision_id, detail=detail,
                            resources=ResourcesWire(network_bytes=network, compute_seconds=compute), trace_id=trace_id)
    try:
        return _ENCODE(record)
    except (TypeError, UnicodeEncodeError):  # e.g. a lone surrogate: let the models say what is wrong
        return None
