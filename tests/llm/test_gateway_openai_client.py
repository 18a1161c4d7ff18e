"""The `openai` client (as installed beside vLLM, in `.venv-vllm`) through the gateway, against
the OpenAI-compatible test server (tests/gateway/fake_openai.py): a streamed chat, a bad
request raised as `BadRequestError` with the gateway's reason, and a TPOT stall raised as an
`APIError` from the final error event — what the README promises a user of the client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from llm_rig import LLM, LlmGateway, start_llm_gateway  # noqa: E402

from policyc.modelserver.llm_model import LlmModelError, vllm_python  # noqa: E402

SCRIPT = r"""
import json, sys
import openai
from openai import OpenAI
base, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base, api_key="unused", max_retries=0)
out = {}
stream = client.chat.completions.create(model=model, stream=True, max_tokens=4,
                                        messages=[{"role": "user", "content": "hi"}])
out["text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
except openai.BadRequestError as e:
    out["bad"] = {"status": e.status_code, "message": str(e)}
try:
    s = client.chat.completions.create(model=model, stream=True, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                       extra_headers={"x-slo-tpot-ms": "200", "x-policyc-fake-stall-after": "2",
                                                      "x-policyc-fake-stall-ms": "3000"})
    for _ in s:
        pass
    out["stall"] = None
except openai.APIError as e:
    out["stall"] = {"type": type(e).__name__, "message": str(e)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def gw() -> Iterator[LlmGateway]:
    g = start_llm_gateway()
    yield g
    g.stop()


def test_the_openai_client_through_the_gateway(gw: LlmGateway) -> None:
    try:
        python = vllm_python()
    except LlmModelError as e:
        pytest.fail(f"the openai client comes with vLLM's venv: {e}")
    out = subprocess.run([str(python), "-c", SCRIPT, f"http://{gw.listen}/v1", LLM], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["text"].split() == ["tok0", "tok1", "tok2", "tok3"]
    assert got["bad"]["status"] == 400 and "unknown model `no-such-model`" in got["bad"]["message"]
    assert got["stall"] is not None and "stalled" in got["stall"]["message"] and "tpot" in got["stall"]["message"], got
