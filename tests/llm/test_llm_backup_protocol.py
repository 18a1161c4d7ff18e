"""A TTFT retry stays on the primary's protocol: Envoy chooses a request's pool (HTTP/1.1 or
HTTP/2) once, for the primary, and the retry goes through that same pool, so the redirect's
fallbacks are only the backup's instances that speak as the primary does (an HTTP/1.1 vLLM
primary never redirects into an HTTP/2 server, nor the other way). No backup speaking it:
no fallback, and the break ends the request as it does without a backup."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_rig import SMALL  # noqa: E402
from llm_rig import LITE, LLM, llm_bundle  # noqa: E402

from policyc.gateway.llm_routes import HTTP1, PROTOCOL_LABEL  # noqa: E402
from policyc.gateway.pool import Pool  # noqa: E402
from policyc.matcher.instance import Instance  # noqa: E402
from policyc.server.app import DecisionServer  # noqa: E402
from policyc.server.config import ServeConfig  # noqa: E402
from policyc.server.fleet import admissible_fleet  # noqa: E402


def test_fallbacks_speak_the_primarys_protocol() -> None:
    bundle = llm_bundle()
    server = DecisionServer(bundle, ServeConfig(cluster=SMALL, start_refresher=False))
    assert server.cluster is not None
    fleet = admissible_fleet(bundle, server.cluster.gpu_slots(), models=[LLM, LITE])
    by_model: dict[str, list[Instance]] = {}
    for inst in fleet:
        by_model.setdefault(inst.model, []).append(inst)

    def register(model: str, i: int, endpoint: str, protocol: str | None) -> Instance:
        slot = by_model[model][i]
        inst = slot.model_copy(update={"id": f"{model}#{i}", "labels": {PROTOCOL_LABEL: protocol} if protocol else {},
                                       "deployment": slot.deployment.model_copy(update={"endpoint": endpoint})})
        server.engine.register(inst)
        return inst

    vllm = register(LLM, 0, "127.0.0.1:41001", HTTP1)  # an HTTP/1.1 primary (vLLM's OpenAI server)
    grpc_primary = register(LLM, 1, "127.0.0.1:41002", None)  # an HTTP/2 one (KServe's gRPC: no label, h2)
    register(LITE, 0, "127.0.0.1:41003", None)  # the backup on HTTP/2 ...
    register(LITE, 1, "127.0.0.1:41004", HTTP1)  # ... and on HTTP/1.1
    pool = Pool(server.engine)

    def fallbacks(primary: Instance) -> list[str]:
        d = primary.deployment
        return [m.endpoint for m in pool.fallbacks(LITE, d.endpoint, f"{d.host}/{d.gpu}", n=4)]

    assert fallbacks(vllm) == ["127.0.0.1:41004"]
    assert fallbacks(grpc_primary) == ["127.0.0.1:41003"]
    server.engine.deregister(f"{LITE}#1")  # no HTTP/1.1 backup left: an HTTP/1.1 primary has no fallback at all
    assert fallbacks(vllm) == [] and fallbacks(grpc_primary) == ["127.0.0.1:41003"]
