"""Z3 variables for one request and one instance, shared by every bundle encoded in it.

Names and strings are interned to integers (`code`); an integer outside the table is a
name no policy mentions, which decodes to a fresh `~other-N`. Quantities are reals in SI,
flags are booleans. Each request variable and each label has a presence flag; the
instance's `slo_latency` has an `infinite` flag for contracts without an SLO. The diff
encodes two bundles in one space, so a witness is one request and one instance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import z3

from policyc.compiler.attributes import attribute_type
from policyc.compiler.bundle import Scalar

from .domains import QUANTITY_TYPES

OTHER_PREFIX = "~other-"


@dataclass(frozen=True)
class Slot:
    """One variable: its value term, presence flag (None: always there) and, for
    slo_latency, whether it is infinite."""

    kind: str  # "real" | "name" | "bool"
    value: z3.ExprRef
    present: z3.BoolRef | None = None
    infinite: z3.BoolRef | None = None


def sort_of(vtype: str) -> str:
    if vtype in QUANTITY_TYPES:
        return "real"
    return "bool" if vtype == "bool" else "name"


def real(x: float, ctx: z3.Context | None = None) -> z3.ArithRef:
    return z3.RealVal(Fraction(x), ctx)


class Space:
    """The names, variables and functions of one Z3 encoding. `ctx`: the Z3 context every
    term is made in (None: Z3's main one). A solver used from its own thread wants a
    context of its own: Z3's contexts are not thread-safe, so terms made or freed in one
    thread while another checks in the same context can crash the process."""

    def __init__(self, ctx: z3.Context | None = None) -> None:
        self.ctx = ctx
        self.codes: dict[str, int] = {}
        self.names: list[str] = []
        self.request: dict[str, Slot] = {}
        self.instance: dict[str, Slot] = {}
        self.axioms: list[z3.BoolRef] = []  # ground facts of the `of` functions: add to every solver
        self._functions: dict[str, z3.FuncDeclRef] = {}
        self._facts: set[tuple[str, str]] = set()

    def code(self, name: str) -> int:
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = len(self.names)
            self.names.append(name)
        return c

    def of(self, attr: str) -> z3.FuncDeclRef:
        """The function from a model's code to a contract-fixed attribute (`version`,
        `slo_latency`, ...): instance classes state `attr == of(attr)(model)`."""
        f = self._functions.get(attr)
        if f is None:
            kind = sort_of(attribute_type(attr) or "string")
            f = self._functions[attr] = z3.Function(f"of.{attr}", z3.IntSort(self.ctx), z3.RealSort(self.ctx) if kind == "real" else z3.IntSort(self.ctx))
        return f

    def fact(self, attr: str, model: str, value: Scalar) -> None:
        """Record `of(attr)(model) == value` once, as an axiom."""
        if (attr, model) in self._facts:
            return
        self._facts.add((attr, model))
        kind = sort_of(attribute_type(attr) or "string")
        self.axioms.append(self.of(attr)(self.code(model)) == self.const(kind, value))

    def reserve(self, names: tuple[str, ...]) -> None:
        """Intern names in this order, so that a group interned together gets consecutive
        codes (a class's model names then become one range test)."""
        for n in names:
            self.code(n)

    def const(self, kind: str, v: Scalar) -> z3.ExprRef:
        if kind == "real":
            return real(float(v), self.ctx)
        if kind == "bool":
            return z3.BoolVal(bool(v), self.ctx)
        return z3.IntVal(self.code(str(v)), self.ctx)

    def var(self, name: str, vtype: str) -> Slot:
        kind = sort_of(vtype)
        key = f"{name}:{kind}"
        slot = self.request.get(key)
        if slot is None:
            mk = {"real": z3.Real, "bool": z3.Bool, "name": z3.Int}[kind]
            slot = self.request[key] = Slot(kind, mk(f"req.{key}", self.ctx), z3.Bool(f"req.{key}?", self.ctx))
        return slot

    def attr(self, name: str) -> Slot:
        slot = self.instance.get(name)
        if slot is None:
            t = attribute_type(name) or "string"
            kind = sort_of(t)
            mk = {"real": z3.Real, "bool": z3.Bool, "name": z3.Int}[kind]
            present = z3.Bool(f"inst.{name}?", self.ctx) if name.startswith("labels.") else None
            infinite = z3.Bool("inst.slo_latency=inf", self.ctx) if name == "slo_latency" else None
            slot = self.instance[name] = Slot(kind, mk(f"inst.{name}", self.ctx), present, infinite)
        return slot

    # ------------------------------------------------------------------ decoding
    def decode(self, slot: Slot, model: z3.ModelRef) -> Scalar | None:
        """The value a model gives a slot, or None when the slot is absent."""
        if slot.present is not None and not z3.is_true(model.eval(slot.present, model_completion=True)):
            return None
        if slot.infinite is not None and z3.is_true(model.eval(slot.infinite, model_completion=True)):
            return math.inf
        v = model.eval(slot.value, model_completion=True)
        if slot.kind == "bool":
            return z3.is_true(v)
        if slot.kind == "name":
            n = v.as_long()
            return self.names[n] if 0 <= n < len(self.names) else f"{OTHER_PREFIX}{n}"
        if z3.is_algebraic_value(v):
            v = v.approx(20)
        frac = v.as_fraction()
        return float(frac)

    def witness(self, model: z3.ModelRef, req_vars: set[str] | None = None) -> tuple[dict[str, Scalar], dict[str, Scalar]]:
        """A concrete request (variables present in the model) and instance attributes."""
        req: dict[str, Scalar] = {}
        for key, slot in self.request.items():
            name = key.rsplit(":", 1)[0]
            if req_vars is not None and name not in req_vars:
                continue
            v = self.decode(slot, model)
            if v is not None:
                req[name] = v
        attrs: dict[str, Scalar] = {}
        for name, slot in self.instance.items():
            v = self.decode(slot, model)
            if v is not None:
                attrs[name] = v
        return req, attrs
