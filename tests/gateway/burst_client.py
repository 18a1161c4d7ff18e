"""A burst of gRPC calls on one connection, from a process of its own (the picker under test
keeps its interpreter to itself): `python burst_client.py HOST:PORT N MODEL [NAME=VALUE …]`
prints one JSON object: how many calls got each outcome, an outcome being the gRPC code,
the refusal's cause (`x-policyc-refusal`) and whether it carried `x-policyc-reason`."""

from __future__ import annotations

import asyncio
import collections
import json
import sys

import grpc

from policyc.modelserver.client import infer_request, token_ids
from policyc.modelserver.oip import InferenceStub


async def burst(target: str, n: int, model: str, metadata: tuple[tuple[str, str], ...]) -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    request = infer_request(model, token_ids(16))
    async with grpc.aio.insecure_channel(target) as channel:  # one channel: one HTTP/2 connection
        stub = InferenceStub(channel)

        async def one() -> None:
            try:
                await stub.ModelInfer(request, metadata=metadata, timeout=30)
                out["OK"] += 1
            except grpc.aio.AioRpcError as e:
                md = dict(e.initial_metadata() or ())
                md.update(dict(e.trailing_metadata() or ()))
                reason = "reason" if md.get("x-policyc-reason") else "NO REASON"
                out[f"{e.code().name} {md.get('x-policyc-refusal', '-')} {reason}"] += 1

        await asyncio.gather(*(one() for _ in range(n)))
    return dict(out)


if __name__ == "__main__":
    target, n, model = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    md = tuple(tuple(a.split("=", 1)) for a in sys.argv[4:])
    print(json.dumps(asyncio.run(burst(target, n, model, md))))  # type: ignore[arg-type]
