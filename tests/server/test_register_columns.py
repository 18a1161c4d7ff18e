"""RegisterInstances' column-by-column checks (`server/register_columns.py`) give every item
RegisterInstance's own verdict: for generated batches mixing good items with every kind of
defect RegisterInstance refuses (a field missing, too long or not printable, a bad CUDA
version or label, an endpoint its syntax or rules refuse, an unknown model, a deployment its
contract refuses, a fact the topology contradicts, a score out of range, an inline
contract), each item is refused with the same status, field, code and message as
`_checked_registration` gives it one by one, or passes with the same facts unverified and
the same instance; the passing ones come back in item order."""

from __future__ import annotations

import math
import random

import pytest

from policyc.compiler.bundle import Bundle
from policyc.matcher import Instance, admission_problems
from policyc.onnxgate.contract_metadata import canonical_json
from policyc.server.app import ServerThread
from policyc.server.convert import register_request
from policyc.server.errors import ServiceError
from policyc.server.proto import pb
from policyc.server.register_columns import check_items


def _good(served: ServerThread, bundle: Bundle) -> list[Instance]:
    """An admissible instance on each GPU slot of the served cluster (true facts)."""
    out = []
    for n, s in enumerate(served.server.cluster.gpu_slots()):
        d = s.to_deployment()
        for c in bundle.contracts:
            inst = Instance(id=f"col-{n}-{c.name}", model=c.name, deployment=d)
            if not admission_problems(inst, bundle):
                out.append(inst)
    assert len(out) > 10
    return out


def _mutated(rng: random.Random, inst: Instance, bundle: Bundle, k: int) -> pb.RegisterInstanceRequest:
    """`inst` as a request, with one defect (or none) chosen by `k`."""
    msg = register_request(inst, score=rng.choice((None, 0.0, 0.5, 1.0)))
    msg.id = f"{inst.id}-{k}"
    d = msg.deployment
    kind = k % 24
    if kind == 1:
        msg.id = ""
    elif kind == 2:
        msg.id = "x" * 300
    elif kind == 3:
        d.host = d.host + "\x00"
    elif kind == 4:
        d.cuda = "twelve"
    elif kind == 5:
        msg.labels["team"] = "a\tb"
    elif kind == 6:
        d.endpoint = "not-an-endpoint"
    elif kind == 7:
        d.endpoint = "169.254.169.254:80"
    elif kind == 8:
        msg.model = "no-such-contract"
    elif kind == 9:
        d.region = "sa-east" if d.region != "sa-east" else "us-west"
    elif kind == 10:
        d.numa_node = d.numa_node + 7
    elif kind == 11:
        msg.score = 1.5
    elif kind == 12:
        msg.score = math.nan
    elif kind == 13:
        msg.ClearField("deployment")
    elif kind == 14:
        d.gpu = ""
    elif kind == 15:
        msg.model = ""
    elif kind == 16:
        msg.model = ""
        msg.contract_json = canonical_json(bundle.contract(inst.model))
    elif kind == 17:
        for j in range(70):
            msg.labels[f"k{j}"] = "v"
    elif kind == 18:
        d.endpoint = f"127.0.0.{1 + k % 200}:{9000 + k % 50}"
    elif kind == 19:
        d.tpm = not d.tpm
    elif kind == 20:
        d.session_state = ""
        d.cuda = ""
    elif kind == 21:
        msg.labels["tier"] = "gold"
    elif kind == 22:
        d.gpu_model = "H100" if d.gpu_model != "H100" else "A100-80G"
    return msg


def _verdict(e: ServiceError) -> tuple:
    code = e.diagnostics[0].code if e.diagnostics else ""
    return (e.status, e.field, code, e.message)


@pytest.mark.parametrize("seed", [1, 2])
def test_column_checks_give_every_item_registerinstances_verdict(served: ServerThread, bundle: Bundle, seed: int) -> None:
    rng = random.Random(seed)
    good = _good(served, bundle)
    items = [_mutated(rng, rng.choice(good), bundle, k) for k in range(240)]
    service = served.server.service

    async def both() -> tuple:
        got = await check_items(service, items, bundle)
        one = []
        for item in items:
            try:
                one.append(await service._checked_registration(item, bundle))
            except ServiceError as e:
                one.append(e)
        return got, one

    got, one = served.call(both())
    passed = [i for i, o in enumerate(one) if not isinstance(o, ServiceError)]
    assert got.items == passed, "the passing items, in item order"
    assert 30 < len(passed) < len(items) - 30  # both verdicts well represented
    for i, o in enumerate(one):
        if isinstance(o, ServiceError):
            assert i in got.refused, (i, o.message)
            assert _verdict(got.refused[i]) == _verdict(o), i
    assert set(got.refused) == set(range(len(items))) - set(passed)
    for r, i in enumerate(got.items):
        inst, _, score, unverified = one[i]
        assert got.batch.instance(r).model_dump() == inst.model_dump(), i
        assert (got.batch.scores[r] if got.batch.scores else None) == score
        assert got.unverified[r] == unverified, i
