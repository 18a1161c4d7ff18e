"""Admission verdicts and attribute views, computed once per deployment signature.

Whether an instance may be registered (`instance.admission_problems`) and every attribute
it is matched on except its host, its NUMA node and its own labels (`instance.attributes`)
depend only on its model and a handful of deployment facts. A fleet of 100,000 instances has a few hundred
such signatures, so the index build does that work a few hundred times and copies a small
dict per instance; the differential tests check the result against `attributes()` itself.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Mapping, Sequence, cast

from policyc.compiler.bundle import Bundle, Scalar

from .errors import AdmissionError
from policyc.compiler.meaning import contract_attributes

from .instance import Instance, admission_problems, deployment_facts

# the deployment facts admission and attributes read, besides the model (host and NUMA node
# apart: admission reads neither, and the attributes take them as they are)
SIGNATURE_FIELDS = ("gpu_model", "region", "tpm", "memory_encryption", "hardware_firewall", "tee", "session_state", "cuda")
_SIGNATURE = itemgetter(*SIGNATURE_FIELDS)
Signature = tuple[str, tuple]


class _Facts:
    """A deployment's signature facts (`SIGNATURE_FIELDS`) as attributes, no host."""

    __slots__ = SIGNATURE_FIELDS + ("host", "gpu", "numa_node", "endpoint")

    def __init__(self, gpu_model: str, region: str, tpm: bool, memory_encryption: bool, hardware_firewall: bool,
                 tee: bool, session_state: str, cuda: str) -> None:
        self.gpu_model, self.region, self.session_state, self.cuda = gpu_model, region, session_state, cuda
        self.tpm, self.memory_encryption, self.hardware_firewall, self.tee = tpm, memory_encryption, hardware_firewall, tee
        self.host, self.gpu, self.numa_node, self.endpoint = "", "", 0, ""


class _Row:
    """An instance as admission reads it (`admission_problems`, `deployment_attributes`)."""

    __slots__ = ("id", "model", "deployment", "labels")

    def __init__(self, iid: str, model: str, deployment: _Facts) -> None:
        self.id, self.model, self.deployment, self.labels = iid, model, deployment, None


class AdmissionCache:
    """Per bundle: a new bundle means new verdicts (`Registry.swap_bundle` makes a new one).
    Each signature gets a small code (`code`), so a registry can keep one int per instance
    and rebuild its attributes from it (`row`) instead of keeping a dict per instance."""

    __slots__ = ("bundle", "_code", "_verdicts", "_label_names", "_contract_parts")

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._code: dict[Signature, int] = {}
        self._verdicts: list[tuple[tuple[str, ...], dict[str, Scalar] | None]] = []
        self._label_names: dict[str, str] = {}  # label key -> attribute name, built once
        # model -> its contract's attributes as `instance_attributes` places them: (model and
        # version, first; the rest, after the deployment's facts), made once per model (a
        # million-instance fleet has ~10 signatures a model)
        self._contract_parts: dict[str, tuple[dict[str, Scalar], dict[str, Scalar]]] = {}

    def attributes(self, inst: Instance) -> dict[str, Scalar]:
        """The instance's attribute view (a fresh dict), or `AdmissionError` naming it."""
        return self.row(self.code_of(inst), inst.deployment.__dict__["host"], inst.deployment.__dict__["numa_node"],
                        inst.labels)

    def code_of(self, inst: Instance) -> int:
        """The instance's signature code, or `AdmissionError` naming it."""
        d = inst.deployment.__dict__  # pydantic keeps field values here; one C call reads them all
        sig = (inst.model, _SIGNATURE(d))
        code = self._code.get(sig)
        if code is None:
            code = self._add(sig, inst)
        problems, base = self._verdicts[code]
        if base is None:
            raise AdmissionError(inst.id, list(problems))
        return code

    def codes(self, ids: Sequence[str], models: Sequence[str], facts: Sequence[Sequence[object]],
              refused: list[tuple[int, tuple[str, ...]]] | None = None) -> list[int]:
        """The codes of a batch's rows: `facts` are the columns of `SIGNATURE_FIELDS` in
        order; the first inadmissible row raises `AdmissionError` naming its id, or, given
        `refused`, every inadmissible row is listed there (its position, its problems) and
        gets code -1."""
        table, verdicts = self._code, self._verdicts
        out: list[int] = []
        put = out.append
        for i, sig in enumerate(zip(models, zip(*facts))):
            code = table.get(sig)
            if code is None:
                # admission reads the model and these facts only: a plain stand-in, not a
                # pydantic object (two of those cost more than the verdict itself)
                dep = _Facts(*sig[1])
                code = self._add(sig, cast(Instance, _Row(ids[i], sig[0], dep)))
            if verdicts[code][1] is None:
                if refused is None:
                    raise AdmissionError(ids[i], list(verdicts[code][0]))
                refused.append((i, verdicts[code][0]))
                code = -1
            put(code)
        return out

    def base(self, code: int) -> dict[str, Scalar]:
        """The attributes every instance of the signature shares (do not mutate)."""
        base = self._verdicts[code][1]
        assert base is not None  # only admitted signatures are given codes out
        return base

    def row(self, code: int, host: str, numa: int, labels: Mapping[str, str] | None) -> dict[str, Scalar]:
        """The attribute view of an instance of signature `code` on this host and NUMA node
        with these labels (a fresh dict)."""
        attrs = self.base(code).copy()
        attrs["host"] = host
        attrs["numa_node"] = float(numa)
        if labels:
            names = self._label_names
            for k, v in labels.items():
                name = names.get(k)
                if name is None:
                    name = names[k] = "labels." + k
                attrs[name] = v
        return attrs

    def _add(self, sig: Signature, inst: Instance) -> int:
        code = self._code[sig] = len(self._verdicts)
        self._verdicts.append(self._compute(inst))
        return code

    def _compute(self, inst: Instance) -> tuple[tuple[str, ...], dict[str, Scalar] | None]:
        problems = admission_problems(inst, self.bundle)
        if problems:
            return tuple(problems), None
        parts = self._contract_parts.get(inst.model)
        if parts is None:
            contract = self.bundle.contract(inst.model)
            assert contract is not None  # admission refuses unknown models
            rest = contract_attributes(contract)
            head = {"model": rest.pop("model"), "version": rest.pop("version")}
            parts = self._contract_parts[inst.model] = (head, rest)
        head, rest = parts
        # `instance_attributes(contract, facts)`: model and version, the facts, the rest
        attrs = head.copy()
        attrs.update(deployment_facts(inst.deployment, self.bundle))
        attrs.update(rest)
        return (), attrs
