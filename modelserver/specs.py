"""What a model-server process is asked to serve (`InstanceSpec`, `ServerSpec`: its
command line) and what a started instance is (`ServingInstance`: its endpoint)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """One registered instance a process serves.

    `model` is its full variant's ONNX file (the embedded contract names the OIP model
    unless `name` says otherwise); `simplified` the smaller variant it serves to retries;
    `aliases` other OIP model names it answers (a backup answers the primary's name, since
    the gateway retries the primary's request body)."""

    instance_id: str
    model: Path
    simplified: Path | None = None
    name: str | None = None
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerSpec:
    """One model-server process: its instances, whether it honours stall requests, and the
    largest answer it sends (None: the server's default, `bounds.DEFAULT_MAX_ANSWER_BYTES`)."""

    instances: tuple[InstanceSpec, ...]
    stall_control: bool = False
    host: str = "127.0.0.1"
    max_answer_bytes: int | None = None

    def argv(self, ready_file: Path) -> list[str]:
        out = [sys.executable, "-m", "policyc.modelserver", "--host", self.host, "--grpc-port", "0",
               "--http-port", "0", "--ready-file", str(ready_file)]
        for i in self.instances:
            path = i.model.resolve()  # absolute: a `=` in it is never read as NAME=
            out += ["--model", f"{i.name}={path}" if i.name else str(path), "--instance", i.instance_id]
            if i.simplified:
                out += ["--simplified", str(i.simplified.resolve())]
            out += [x for a in i.aliases for x in ("--alias", a)]
        if self.stall_control:
            out.append("--stall-control")
        if self.max_answer_bytes is not None:
            out += ["--max-answer-bytes", str(self.max_answer_bytes)]
        return out


@dataclass(frozen=True, slots=True)
class ServingInstance:
    """A started instance: what the registry and the gateway need to reach it."""

    instance_id: str
    model: str               # the OIP model name (its contract's name unless renamed)
    contract: str            # the contract embedded in its model file
    endpoint: str            # host:port of its OIP v2 gRPC server (HTTP/2)
    http_endpoint: str       # host:port of its process's OIP v2 REST server (metrics, health)
    model_path: Path
    variants: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    on_rest: bool = True     # its model name is served on the REST port (no other instance of the process answers it)
