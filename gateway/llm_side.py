"""The LLM half of `policyc gateway` (`runner.Gateway` holds one): the picker reading LLM
bodies with the models' tokenizers, the stream supervisor's server, the HTTP/1.1 pool's
EDS file (the same endpoints as the HTTP/2 pool's), and the LLM routes for the bootstrap.

Tokenizers: `--tokenizer MODEL=PATH` (a `tokenizer.json` or the model folder holding one);
a model without one gets the declared estimate, labelled as such.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policyc.server.app import ServerThread

from .llm_pick import LlmPicks
from .llm_routes import POOL_HTTP1_CLUSTER, LlmRoutes
from .llm_stream import StreamSupervisor, SupervisorServer
from .tokens import Tokenizers

if TYPE_CHECKING:
    from policyc.server.app import DecisionServer

    from .server import PickerServer


@dataclass(frozen=True)
class LlmOptions:
    tokenizers: tuple[tuple[str, Path], ...] = ()  # (model, tokenizer.json or its folder)
    max_body_bytes: int = 4 << 20
    body_timeout_ms: int = 10_000


def eds_document_http1(endpoints: tuple[str, ...] | list[str], version: str) -> dict[str, Any]:
    """The HTTP/1.1 pool's EDS document (the HTTP/2 pool's endpoints under its own name)."""
    from .bootstrap import load_assignment

    cla = {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
           **load_assignment(POOL_HTTP1_CLUSTER, endpoints)}
    return {"version_info": version, "resources": [cla]}


class LlmSide:
    def __init__(self, thread: ServerThread[DecisionServer], picker: "PickerServer", workdir: Path, options: LlmOptions) -> None:
        self.thread = thread
        self.options = options
        self.eds_path = workdir / "pool-http1.json"
        tokenizers = Tokenizers()
        for model, path in options.tokenizers:
            tokenizers.register(model, path)  # loaded now: a bad file is refused at start, not on a request
        self.picks = LlmPicks(tokenizers, max_body_bytes=options.max_body_bytes)
        picker.picker.enable_llm(self.picks)
        recent, acts, server = picker.picker.recent, picker.acts, thread.server
        self.supervisor = StreamSupervisor(self.picks, lambda: server.engine.state.bundle, acts.log, acts.anomalies,
                                           lambda did: recent[did].gpu_key if did in recent else None,
                                           lambda did: recent[did].retry_headers if did in recent else (),
                                           self._gpu_model_of, picker.picker.end_in_flight,
                                           picker.picker.first_token)
        self._picker, self._thread = picker, thread
        self.server = SupervisorServer(self.supervisor)
        self.routes: LlmRoutes | None = None

    def _gpu_model_of(self, decision_id: str) -> str | None:
        pick = self._picker.picker.recent.get(decision_id)
        if pick is None:
            return None
        try:
            return self._thread.server.engine.state.registry.get(pick.instance_id).deployment.gpu_model
        except Exception:  # noqa: BLE001 - deregistered since it answered
            return None

    def start(self) -> LlmRoutes:
        # on the decision server's loop, beside the picker: a loop of its own thread measured slower
        # (SupervisorServer's docstring)
        port = self._thread.call(self.server.start())
        self.routes = LlmRoutes(max_body_bytes=self.options.max_body_bytes, body_timeout_ms=self.options.body_timeout_ms,
                                eds_path_http1=str(self.eds_path), supervisor=f"127.0.0.1:{port}")
        return self.routes

    def write_pool(self, endpoints: tuple[str, ...], version: str) -> None:
        tmp = self.eds_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(eds_document_http1(endpoints, version)))
        os.replace(tmp, self.eds_path)  # atomic: Envoy watches for the move

    def stop(self) -> None:
        self._thread.call(self.server.stop())


def parse_tokenizer_option(text: str) -> tuple[str, Path]:
    """`MODEL=PATH` (the `--tokenizer` option), or ValueError saying what is wrong."""
    model, sep, path = text.partition("=")
    if not sep or not model or not path:
        raise ValueError(f"`{text}` is not MODEL=PATH (e.g. tiny-llm=/models/tiny-llm/tokenizer.json)")
    return model, Path(path)
