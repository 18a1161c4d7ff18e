"""Admission verdicts and attribute views, computed once per deployment signature.

Whether an instance may be registered (`instance.admission_problems`) and every attribute
it is matched on except its host, its NUMA node and its own labels (`instance.attributes`)
depend only on its model and a handful of deployment facts. A fleet of 100,000 instances has a few hundred
such signatures, so the index build does that work a few hundred times and copies a small
dict per instance; the differential tests check the result against `attributes()` itself.
"""

from __future__ import annotations

from operator import itemgetter

from policyc.compiler.bundle import Bundle, Scalar

from .errors import AdmissionError
from .instance import Instance, admission_problems, deployment_attributes

# the deployment facts admission and attributes read, besides the model (host and NUMA node
# apart: admission reads neither, and the attributes take them as they are)
_SIGNATURE = itemgetter("gpu_model", "region", "tpm", "memory_encryption", "hardware_firewall", "tee",
                        "session_state", "cuda")
Signature = tuple[str, tuple]


class AdmissionCache:
    """Per bundle: a new bundle means new verdicts (`Registry.swap_bundle` makes a new one)."""

    __slots__ = ("bundle", "_by_signature", "_label_names")

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._by_signature: dict[Signature, tuple[tuple[str, ...], dict[str, Scalar] | None]] = {}
        self._label_names: dict[str, str] = {}  # label key -> attribute name, built once

    def attributes(self, inst: Instance) -> dict[str, Scalar]:
        """The instance's attribute view (a fresh dict), or `AdmissionError` naming it."""
        d = inst.deployment.__dict__  # pydantic keeps field values here; one C call reads them all
        sig = (inst.model, _SIGNATURE(d))
        hit = self._by_signature.get(sig)
        if hit is None:
            hit = self._by_signature[sig] = self._compute(inst)
        problems, base = hit
        if base is None:
            raise AdmissionError(inst.id, list(problems))
        attrs = base.copy()
        attrs["host"] = d["host"]
        attrs["numa_node"] = float(d["numa_node"])
        labels = inst.labels
        if labels:
            names = self._label_names
            for k, v in labels.items():
                name = names.get(k)
                if name is None:
                    name = names[k] = "labels." + k
                attrs[name] = v
        return attrs

    def _compute(self, inst: Instance) -> tuple[tuple[str, ...], dict[str, Scalar] | None]:
        problems = admission_problems(inst, self.bundle)
        if problems:
            return tuple(problems), None
        contract = self.bundle.contract(inst.model)
        assert contract is not None  # admission refuses unknown models
        return (), deployment_attributes(inst.deployment, contract, self.bundle)
