"""Instance classes: contracts grouped by the deployment choices they leave open.

Encoding a fleet as one Z3 disjunct per contract makes every rule and diff query grow
with the fleet: each disjunct repeats a dozen constraints and the solver case-splits over
all of them. Most of a contract's domain is shared with many others (the region set,
security flags, session state, declared labels, usable GPU classes), so contracts that
agree on those become one class and one disjunct. What is fixed per contract (name,
version, SLO, FLOPs, bandwidth) is kept exact without a disjunct per contract: the class
says `model` is one of its members (consecutive codes, so a range test), and each fixed
attribute is a function of the model (`version == version_of(model)`, …) whose values are
ground facts, one per member (`Space.axioms`). The class encoding is therefore *exactly*
the union of its members' domains — no abstraction, so every witness is concrete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from policyc.compiler.bundle import Contract

from .domains import Domains, contract_regions, usable_gpus


@dataclass(frozen=True, slots=True)
class ClassKey:
    """Everything about a contract's instances except what is fixed per contract."""

    regions: tuple[str, ...] | None  # None: any region name
    security: tuple[str, ...]  # flags every instance has on
    session: str | None  # None: any session state
    labels: tuple[tuple[str, str | None], ...]  # label keys rules read -> declared value (None: free)
    gpus: tuple[str, ...] | None  # usable GPU classes; None: the bundle has no catalog
    archs: tuple[str, ...] | None  # allowed architectures, only without a catalog
    has_slo: bool  # False: `slo_latency` is infinite


@dataclass(frozen=True, slots=True)
class InstanceClass:
    key: ClassKey
    members: tuple[Contract, ...]  # in bundle order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.members)


def class_key(c: Contract, dom: Domains) -> ClassKey | None:
    """The class of a contract, or None when no instance of it can exist (no usable GPU)."""
    gpus = usable_gpus(c, dom) if dom.gpus else None
    if gpus is not None and not gpus:
        return None
    labels = dict(c.labels)
    return ClassKey(
        regions=contract_regions(c, dom),
        security=tuple(sorted(set(c.security))),
        session=c.session.state if c.session is not None and c.session.state != "remote" else None,
        labels=tuple((k, labels.get(k)) for k in dom.label_keys),
        gpus=gpus,
        archs=c.gpu_arch if not dom.gpus and c.gpu_arch else None,
        has_slo=c.slo is not None,
    )


def group(contracts: Iterable[Contract], dom: Domains) -> tuple[InstanceClass, ...]:
    """Contracts grouped into classes, in order of first member; contracts that can have
    no instance at all are left out (their domain is empty)."""
    members: dict[ClassKey, list[Contract]] = {}
    for c in contracts:
        key = class_key(c, dom)
        if key is not None:
            members.setdefault(key, []).append(c)
    return tuple(InstanceClass(k, tuple(v)) for k, v in members.items())
