"""Registering the fleet over gRPC: the simulated cluster's instances (placement at scale,
no endpoint), an ONNX model whose embedded contract lost a section (refused, naming the
field), and the real model servers, each with the ONNX file it serves and its endpoint."""

from __future__ import annotations

import json
import time

import grpc

from policyc.compiler.bundle import Bundle
from policyc.modelserver.launcher import ModelPool
from policyc.onnxgate.contract_metadata import CONTRACT_KEY, HASH_KEY, canonical_json, contract_hash, embed_contract
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer
from policyc.placer.topology import GpuSlot
from policyc.server import convert
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb_grpc

from .model_pool import RealInstance
from .narration import DemoError, Narrator


def register_simulated(say: Narrator, stub: pb_grpc.DecisionsStub, bundle: Bundle, slots: tuple[GpuSlot, ...],
                       real: list[RealInstance]) -> None:
    taken = {r.id for r in real}
    fleet = [i for i in admissible_fleet(bundle, slots) if i.id not in taken]
    t = time.perf_counter()
    for inst in fleet:
        stub.RegisterInstance(convert.register_request(inst))
    by_model: dict[str, int] = {}
    for inst in fleet:
        by_model[inst.model] = by_model.get(inst.model, 0) + 1
    say.say(f"{len(fleet)} simulated instances in {time.perf_counter() - t:.2f} s (placement only, no endpoint): "
            + ", ".join(f"{m} {n}" for m, n in sorted(by_model.items())))


def refuse_broken_onnx(say: Narrator, stub: pb_grpc.DecisionsStub, bundle: Bundle, real: RealInstance) -> None:
    contract = bundle.contract("fraud-scorer-lite")
    assert contract is not None
    model = build_transformer(TransformerSpec(vocab=200, d_model=32, heads=2, layers=1, d_ff=64, max_len=64))
    raw = json.loads(canonical_json(contract))
    del raw["memory"]
    text = json.dumps(raw, sort_keys=True, separators=(",", ":"))
    bad = embed_contract(model, contract)
    for p in bad.metadata_props:
        if p.key == CONTRACT_KEY:
            p.value = text
        elif p.key == HASH_KEY:
            p.value = contract_hash(text)
    inst = real.instance().model_copy(update={"id": "broken-onnx", "model": ""})
    try:
        stub.RegisterInstance(convert.register_request(inst, onnx_model=bad.SerializeToString()))
    except grpc.RpcError as e:
        field = dict(e.trailing_metadata() or ()).get("policyc-field")
        say.say(f"ONNX model missing a contract section → {e.code().name}: {e.details()} [field {field}]")
        return
    raise DemoError("an ONNX model without `memory` was registered")


def register_real(say: Narrator, stub: pb_grpc.DecisionsStub, pool: ModelPool, real: list[RealInstance]) -> None:
    """Each real instance registers with the model file its server serves (the contract
    travels inside it) and the endpoint of its server's gRPC port."""
    for r in real:
        served = pool.instance(r.id)
        onnx_bytes = served.model_path.read_bytes()
        reply = stub.RegisterInstance(convert.register_request(r.instance(served.endpoint), onnx_model=onnx_bytes))
        extra = f", {'/'.join(served.variants)} variants, also answers {', '.join(served.aliases)}" if served.aliases else ""
        say.say(f"  `{reply.instance_id}` ({r.role}) → {served.endpoint}: contract `{reply.model}` from its ONNX "
                f"({len(onnx_bytes) // 1024} KiB){extra}")
