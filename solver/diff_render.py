"""A diff report as text for people and JSON for machines (`policyc diff --format`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from policyc.compiler.attributes import attribute_type
from policyc.compiler.bundle import Scalar
from policyc.compiler.units import format_si

from .diff import DiffReport, Difference, Direction

_HEAD = {
    Direction.WIDENED: "NEW admits what OLD refused",
    Direction.NARROWED: "NEW refuses what OLD admitted",
}
_CONTRACT_TERMS = ("version", "flops_min", "flops_max", "bandwidth", "slo_latency")


def _show(name: str, v: Scalar, vtype: str | None) -> str:
    if isinstance(v, bool):
        return f"{name}={'yes' if v else 'no'}"
    if isinstance(v, float):
        return f"{name}={format_si(v, vtype or 'count')}"
    return f"{name}={v}"


def _request(d: Difference, var_types: Mapping[str, str]) -> str:
    if not d.request:
        return "(no variables)"
    return ", ".join(_show(k, v, var_types.get(k)) for k, v in sorted(d.request.items()))


def _instance(d: Difference) -> str:
    return ", ".join(_show(k, v, attribute_type(k)) for k, v in sorted(d.instance.items()) if k not in _CONTRACT_TERMS)


def render_text(report: DiffReport, var_types: Mapping[str, str]) -> str:
    out: list[str] = []
    for i, d in enumerate(report.differences, 1):
        tag = f" [compliance widened: {', '.join(d.compliance)}]" if d.compliance else ""
        out.append(f"difference {i}: {_HEAD[d.direction]}{tag}")
        if d.compliance:
            attr = d.compliance[0]
            value = d.instance.get(attr)
            what = f"in region `{value}`" if attr == "region" else f"without `{attr}`"
            out.append(f"  this request may now be served on an instance {what}; OLD served it on no such instance")
        out.append(f"  request:  {_request(d, var_types)}")
        out.append(f"  instance: {_instance(d)}")
        for label, rules in (("OLD", d.old_rejects), ("NEW", d.new_rejects)):
            for r in rules:
                out.append(f"  {label} rule `{r.id}` rejects it ({r.origin})")
        for why in d.domain:
            out.append(f"  {why}")
    if report.truncated:
        out.append("(more differences exist; raise --max to list them)")
    for u in report.undecided:
        out.append(f"undecided: {u}")
    n = len(report.differences)
    verdict = ("equivalent" if n == 0 and not report.undecided else
               f"{n} difference{'s' * (n != 1)}" + (", compliance widened" if report.widens_compliance else ""))
    out.append(verdict)
    return "\n".join(out) + "\n"


def _jsonable(v: Scalar) -> Scalar | str:
    return "inf" if isinstance(v, float) and math.isinf(v) else v


def to_json(report: DiffReport) -> str:
    return json.dumps({
        "equivalent": not report.differences and not report.undecided,
        "widens_compliance": report.widens_compliance,
        "exit_code": report.exit_code,
        "truncated": report.truncated,
        "undecided": list(report.undecided),
        "differences": [{
            "direction": d.direction.value,
            "compliance": list(d.compliance),
            "request": {k: _jsonable(v) for k, v in sorted(d.request.items())},
            "instance": {k: _jsonable(v) for k, v in sorted(d.instance.items())},
            "old_rejects": [{"rule": r.id, "origin": str(r.origin)} for r in d.old_rejects],
            "new_rejects": [{"rule": r.id, "origin": str(r.origin)} for r in d.new_rejects],
            "domain": list(d.domain),
        } for d in report.differences],
    }, indent=1, sort_keys=True)
