"""`policyc modelserver --engine vllm --model [NAME=]DIR --port P`: serve an LLM folder with
a real vLLM OpenAI server (CPU build, from `.venv-vllm`), with the contract that travels with
the model (`DIR/policyc.contract`, compiled here), and register it with the decision
service at its endpoint (`--register`, through `policyc.client` like `policyc instance
register`: the same connection flags, token and TLS). `--engine emulator` serves the same
folder with the vLLM-compatible emulator in this process instead (`modelserver/emulator.py`:
the same routes and `vllm:*` metrics, a timing model; `--slowdown X` for a slower GPU class).

    policyc modelserver --engine vllm --model .venv-vllm/models/tiny-llama --port 8000 \\
        --register --instance tiny-llama@host-01/gpu0 --deploy host=host-01 --deploy gpu=gpu0 \\
        --deploy gpu_model=A100-80G --deploy region=us-west

The command stays in the foreground while vLLM serves; SIGTERM or SIGINT deregisters the
instance (when it registered it) and stops vLLM. vLLM dies with this process
(`PR_SET_PDEATHSIG`). It lives in the command line, not in `modelserver/`, because it
compiles the model's contract and the run time reads bundles only.

Exit codes: 0 stopped by SIGTERM/SIGINT; 1 the contract does not compile, or vLLM did not
start or died; 2 usage (no model folder, KServe-only options, a bad `--deploy`); 6 / 7 the
decision service could not be reached / refused the registration (vLLM is stopped).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from .exit_codes import Exit

ENGINES = ("kserve", "vllm", "emulator")
_BOOL = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
_DEPLOY_BOOLS = ("tpm", "memory_encryption", "hardware_firewall", "tee")
_DEPLOY_TEXT = ("host", "gpu", "gpu_model", "region", "session_state", "cuda", "endpoint")


class _Usage(ValueError):
    pass


class _Failed(RuntimeError):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options `--engine vllm` adds to `policyc modelserver` (KServe's stay as they are)."""
    from .connection import add_connection_flags

    g = p.add_argument_group("LLM engines (--engine vllm | emulator)")
    g.add_argument("--engine", choices=ENGINES, default="kserve",
                   help="kserve: ONNX models over OIP (default); vllm: an LLM folder with vLLM's OpenAI server; "
                        "emulator: the same routes and vllm:* metrics with a timing model (modelserver/emulator.py)")
    g.add_argument("--slowdown", type=float, default=1.0, metavar="X",
                   help="emulator: stretch every duration by X (a slower GPU class; default 1)")
    g.add_argument("--port", type=int, default=0, metavar="P", help="vLLM's HTTP port (0: any free port; default 0)")
    g.add_argument("--cpu-bind", default="auto", metavar="CORES",
                   help="cores vLLM's OpenMP threads are bound to: auto, or e.g. 0, 1, 0-1 (default auto)")
    g.add_argument("--kv-cache-gib", type=int, default=1, metavar="N", help="vLLM's KV cache on the CPU, GiB (default 1)")
    g.add_argument("--max-model-len", type=int, default=1024, metavar="N", help="the context vLLM serves (default 1024)")
    g.add_argument("--register", action="store_true",
                   help="register the instance with the decision service (--server, --token) once it serves")
    g.add_argument("--deploy", action="append", default=[], metavar="KEY=VALUE",
                   help="a deployment fact for --register (host, gpu, gpu_model, region, numa_node, tpm, …); repeatable")
    g.add_argument("--label", action="append", default=[], metavar="KEY=VALUE", help="an instance label for --register; repeatable")
    g.add_argument("--workdir", type=Path, help="where vLLM's log goes (default: a temporary folder, removed on a clean stop)")
    add_connection_flags(p, with_format=False)


def load_model_contract(model_dir: Path, name: str | None = None):  # type: ignore[no-untyped-def]  # -> Contract
    """The contract that travels with the model (`policyc.contract` in its folder),
    compiled; the one named `name` when the file holds several. `_Failed` with the
    compiler's located diagnostics when it does not compile."""
    from policyc.compiler.pipeline import compile_paths
    from policyc.dsl.diagnostics import render_text
    from policyc.modelserver.llm_model import CONTRACT_FILE

    path = model_dir / CONTRACT_FILE
    if not path.is_file():
        raise _Failed(f"{model_dir}: no {CONTRACT_FILE} (the model's contract travels in its folder: "
                      "`policyc llm make-model` writes one)")
    result = compile_paths([path], analyse=False)
    errors = [d for d in result.diagnostics if getattr(d, "is_error", True)]
    if errors or result.bundle is None:
        raise _Failed(f"{path}: the contract does not compile:\n{render_text(errors, result.sources)}")
    contracts = result.bundle.contracts
    if name is None:
        if len(contracts) != 1:
            raise _Failed(f"{path}: {len(contracts)} contracts; name the one to serve (--model NAME=DIR)")
        return contracts[0]
    for c in contracts:
        if c.name == name:
            return c
    raise _Failed(f"{path}: no contract `{name}` (it has {', '.join(f'`{c.name}`' for c in contracts)})")


def check_model_cost(model_dir: Path, contract: Any) -> None:
    """The gate before serving: the contract's per-token cost against the folder's
    `config.json` (`onnxgate.llm_config_check`); `_Failed` with the gate's message on drift.
    Checked here because the model folder is here: the decision service receives only the
    contract when this command registers the instance."""
    from policyc.onnxgate.llm_config_check import check_llm_config

    verdict = check_llm_config(model_dir, contract)
    if not verdict.ok:
        raise _Failed(verdict.message)


def deployment(facts: list[str], endpoint: str) -> dict[str, Any]:
    """`--deploy KEY=VALUE` facts as a Deployment's fields; the endpoint defaults to where vLLM listens."""
    out: dict[str, Any] = {}
    for kv in facts:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise _Usage(f"--deploy `{kv}`: expected KEY=VALUE")
        if key in out:
            raise _Usage(f"--deploy `{key}` given twice")
        if key in _DEPLOY_BOOLS:
            if value.lower() not in _BOOL:
                raise _Usage(f"--deploy {key}=`{value}`: expected true or false")
            out[key] = _BOOL[value.lower()]
        elif key == "numa_node":
            if not value.isdigit() or len(value) > 4:
                raise _Usage(f"--deploy numa_node=`{value}`: expected a small non-negative integer")
            out[key] = int(value)
        elif key in _DEPLOY_TEXT:
            out[key] = value
        else:
            raise _Usage(f"--deploy `{key}`: not a deployment fact (one of {', '.join(sorted((*_DEPLOY_TEXT, *_DEPLOY_BOOLS, 'numa_node')))})")
    out.setdefault("endpoint", endpoint)
    return out


def labels(given: list[str], model_dir: Path, engine: str = "vllm") -> dict[str, str]:
    """What a gateway and the metrics scraper read off an LLM instance (the emulator speaks
    vLLM's protocol and metrics), then `--label`s."""
    out = {"engine": engine, "endpoint_protocol": "http1", "metrics": "vllm", "model_dir": str(model_dir.resolve())}
    for kv in given:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            raise _Usage(f"--label `{kv}`: expected KEY=VALUE")
        out[key] = value
    return out


def _check_options(args: argparse.Namespace) -> tuple[str | None, Path]:
    if len(args.instances) != 1:
        raise _Usage(f"--engine vllm serves one model folder per process; {len(args.instances)} --model given")
    inst = args.instances[0]
    kserve_only = [o for o, v in (("--simplified", inst.simplified), ("--alias", inst.aliases), ("--grpc-port", inst.grpc_port),
                                  ("--stall-control", args.stall_control)) if v]
    if kserve_only:
        raise _Usage(f"{', '.join(kserve_only)}: KServe options; --engine vllm does not take them")
    if not 0 <= args.port <= 65535:
        raise _Usage(f"--port {args.port}: not a port")
    if args.kv_cache_gib < 1 or args.max_model_len < 16:
        raise _Usage("--kv-cache-gib must be at least 1 and --max-model-len at least 16")
    if args.engine == "emulator" and not 0.01 <= args.slowdown <= 1000:
        raise _Usage(f"--slowdown {args.slowdown}: expected a factor in [0.01, 1000]")
    head, sep, tail = inst.model.partition("=")
    name, path = (head, tail) if sep and "/" not in head else (None, inst.model)
    model_dir = Path(path)
    if args.engine == "emulator":
        if not model_dir.is_dir():
            raise _Usage(f"{model_dir}: not a model folder (the emulator reads its policyc.contract and tokenizer.json)")
    elif not (model_dir / "config.json").is_file():
        raise _Usage(f"{model_dir}: not a model folder (no config.json); `policyc llm make-model DIR` makes one")
    if args.register and not args.deploy:
        raise _Usage("--register needs the deployment's facts: --deploy host=… --deploy gpu=… --deploy gpu_model=… --deploy region=…")
    return name, model_dir


class _Stop(Exception):
    pass


def run(args: argparse.Namespace, prog: str = "policyc modelserver") -> int:
    """Serve, register, wait for SIGTERM/SIGINT, deregister, stop."""
    from policyc.modelserver.vllm_engine import VllmError, VllmServer, VllmSpec

    engine = "vLLM" if args.engine == "vllm" else "the emulator"

    try:
        name, model_dir = _check_options(args)
        contract = load_model_contract(model_dir, name)
        check_model_cost(model_dir, contract)
        served = name or contract.name
        instance_id = args.instances[0].instance or served
        lbl = labels(args.label, model_dir, args.engine)
    except _Usage as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return Exit.USAGE
    except _Failed as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return Exit.FAILED

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()
        raise _Stop

    own_dir = args.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="policyc-vllm-")) if own_dir else args.workdir
    server: Any = _Emulated(served, model_dir, args) if args.engine == "emulator" else \
        VllmServer(VllmSpec(model_dir, served, host=args.host, port=args.port, cpu_bind=args.cpu_bind,
                            kv_cache_gib=args.kv_cache_gib, max_model_len=args.max_model_len), workdir)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    registered = None
    clean = False
    try:
        try:
            server.spawn()
            print(f"{prog}: starting {engine} for `{served}` from {model_dir} on {server.endpoint} (log {server.log_path})",
                  file=sys.stderr, flush=True)
            server.wait_ready()
            if args.register:
                registered, code = _register(args, prog, instance_id, contract, deployment(args.deploy, server.endpoint), lbl)
                if registered is None:
                    return code
            if args.ready_file:
                _write_ready(args.ready_file, args.engine, server, served, instance_id, model_dir, registered)
            print(f"{prog}: serving `{served}` at http://{server.endpoint}/v1 (pid {server.pid}, ready in "
                  f"{server.startup_s:.0f} s){' as ' + instance_id if registered else ''}", file=sys.stderr, flush=True)
            while not stop.is_set():
                if not server.running:
                    print(f"{prog}: error: {engine} exited while serving:\n{server.log_tail()}", file=sys.stderr)
                    return Exit.FAILED
                stop.wait(0.5)
        except _Stop:
            pass
        except (VllmError, OSError) as e:  # did not start; a port that cannot be bound
            print(f"{prog}: error: {e}", file=sys.stderr)
            return Exit.FAILED
        except _Usage as e:
            print(f"{prog}: error: {e}", file=sys.stderr)
            return Exit.USAGE
        clean = True  # stopped by SIGTERM/SIGINT
        return Exit.OK
    finally:
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        if registered is not None:
            _deregister(args, prog, instance_id)
        server.stop()
        for s, h in previous.items():
            signal.signal(s, h)
        if own_dir and clean:
            shutil.rmtree(workdir, ignore_errors=True)


def register_instance(client: Any, instance_id: str, contract: Any, dep: dict[str, Any], lbl: dict[str, str]) -> Any:
    """Register a served LLM: its id, its deployment (endpoint included), its labels and the
    contract that travelled with it (as JSON in the bundle's schema: the service refuses
    one that drifted from its bundle's). `client` is a `policyc.client.DecisionClient`;
    ClientError when the service refuses."""
    from policyc.onnxgate.contract_metadata import canonical_json

    return client.register(instance_id, dep, model=contract.name, labels=lbl, contract_json=canonical_json(contract))


class _Emulated:
    """The emulator behind the interface the command drives `VllmServer` through."""

    def __init__(self, served: str, model_dir: Path, args: argparse.Namespace) -> None:
        from policyc.modelserver.emulator import EmulatorServer, EmulatorSpec, TimingModel

        self._server = EmulatorServer([EmulatorSpec(served, model_dir, TimingModel(max_model_len=args.max_model_len),
                                                    slowdown=args.slowdown, host=args.host, port=args.port)])
        self.log_path = "(in this process)"
        self.pid = os.getpid()
        self.startup_s: float | None = None

    def spawn(self) -> None:
        self._server.start()
        self.startup_s = self._server.startup_s

    def wait_ready(self) -> None:
        pass

    @property
    def endpoint(self) -> str:
        return self._server.endpoints[0] if self._server.endpoints else f"(port {self._server.specs[0].port})"

    @property
    def base_url(self) -> str:
        return f"http://{self.endpoint}/v1"

    @property
    def port(self) -> int:
        return int(self.endpoint.rpartition(":")[2])

    @property
    def running(self) -> bool:
        return self._server.running

    def log_tail(self) -> str:
        return ""

    def stop(self) -> None:
        self._server.stop()


def _register(args: argparse.Namespace, prog: str, instance_id: str, contract: Any, dep: dict[str, Any],
              lbl: dict[str, str]) -> tuple[Any, int]:
    """Register through `policyc.client` (the connection flags: server, token, TLS);
    the reply, or None and the exit code of the failure (already reported)."""
    from policyc.client import ClientError

    from .connection import connect, fail

    try:
        client = connect(args)
    except OSError as e:
        print(f"{prog}: error: {args.tls_ca}: {e.strerror}", file=sys.stderr)
        return None, Exit.USAGE
    with client:
        try:
            reply = register_instance(client, instance_id, contract, dep, lbl)
        except ClientError as e:
            return None, fail("modelserver", args, e)
    print(f"{prog}: registered {reply.instance_id} ({reply.model}) at {dep['endpoint']} with {args.server}; "
          f"{reply.registry_size} instances", file=sys.stderr, flush=True)
    return reply, Exit.OK


def _deregister(args: argparse.Namespace, prog: str, instance_id: str) -> None:
    from policyc.client import ClientError

    from .connection import connect

    try:
        with connect(args) as client:
            client.deregister(instance_id)
    except (ClientError, OSError) as e:  # the service may be gone first; the instance's lease ends with it
        print(f"{prog}: warning: could not deregister {instance_id}: {e}", file=sys.stderr)


def _write_ready(path: Path, engine: str, server: Any, served: str, instance_id: str, model_dir: Path, registered: Any) -> None:
    facts = {"engine": engine, "endpoint": server.endpoint, "base_url": server.base_url, "port": server.port,
             "model": served, "instance": instance_id, "model_dir": str(model_dir.resolve()), "pid": server.pid,
             "registered": registered is not None, "startup_s": round(server.startup_s or 0.0, 2)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(facts, indent=1, sort_keys=True))
    os.replace(tmp, path)
