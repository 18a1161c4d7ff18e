"""What "admitted" means within the fleet's declared domains, in plain Python.

The meaning of rules themselves is `compiler/semantics.py` (shared with the matcher): a
rule applies when the request has every variable the rule reads and its guard holds; an
instance may serve the request iff every applicable rule's requirement holds on the
instance's attributes. This module adds the domains: requests and instances outside what
the bundle declares are not admitted. Every Z3 verdict is replayed through it in tests.
"""

from __future__ import annotations

from typing import Mapping

from policyc.compiler.bundle import Bundle, Contract, RequestRule, Scalar
from policyc.compiler.meaning import fixed_attributes
from policyc.compiler.semantics import admits, applicable_rules

from .domains import QUANTITY_TYPES, SESSION_STATES, Domains, contract_regions, usable_gpus

Request = Mapping[str, Scalar]
Attrs = Mapping[str, Scalar]


def rules_admit(rules: tuple[RequestRule, ...], req: Request, attrs: Attrs) -> bool:
    """Every rule that applies to the request holds on the instance (`compiler/semantics.py`)."""
    return admits(applicable_rules(rules, req), attrs, req)


def request_in_domain(dom: Domains, req: Request) -> bool:
    for name, vd in dom.vars.items():
        if name == "tenant_class":
            continue
        if name not in req:
            if vd.always_present:
                return False
            continue
        v = req[name]
        if vd.type in QUANTITY_TYPES:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                return False
            if vd.range is not None and not (vd.range.lo <= v <= vd.range.hi):
                return False
        elif vd.type == "bool":
            if not isinstance(v, bool):
                return False
        elif not isinstance(v, str) or (vd.values is not None and v not in vd.values):
            return False
    tenant = req.get("tenant")
    if isinstance(tenant, str) and tenant in dom.tenants:
        return req.get("tenant_class") == dom.tenants[tenant]
    return "tenant_class" not in req


def contract_admits(contract: Contract, dom: Domains, attrs: Attrs) -> bool:
    """Whether these attributes describe a possible instance of this contract."""
    if any(attrs.get(k) != v for k, v in fixed_attributes(contract).items()):
        return False
    regions = contract_regions(contract, dom)
    if regions is not None and attrs.get("region") not in regions:
        return False
    gpu = attrs.get("gpu_model")
    if dom.gpus:
        if gpu not in usable_gpus(contract, dom) or attrs.get("gpu_arch") != dom.gpus[gpu][0]:
            return False
    elif contract.gpu_arch and attrs.get("gpu_arch") not in contract.gpu_arch:
        return False
    if any(attrs.get(s) is not True for s in contract.security):
        return False
    state = attrs.get("session_state")
    if state not in SESSION_STATES:
        return False
    if contract.session is not None and contract.session.state != "remote" and state != contract.session.state:
        return False
    numa = attrs.get("numa_node")
    if not isinstance(numa, (int, float)) or numa < 0 or numa != int(numa):
        return False
    labels = dict(contract.labels)
    return all(attrs.get("labels." + k) == labels[k] for k in dom.label_keys if k in labels)


def instance_in_domain(bundle: Bundle, dom: Domains, attrs: Attrs) -> bool:
    c = bundle.contract(str(attrs.get("model")))
    return c is not None and contract_admits(c, dom, attrs)


def admitted(bundle: Bundle, dom: Domains, req: Request, attrs: Attrs) -> bool:
    """The meaning of a bundle: may this instance serve this request?"""
    return request_in_domain(dom, req) and instance_in_domain(bundle, dom, attrs) and rules_admit(bundle.rules, req, attrs)
