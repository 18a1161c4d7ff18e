"""The corpus classes that need the ONNX gate, a running decision service or the CLI.

Kept apart from `corpus.py` so the contract and bundle classes never import onnx or
grpc. Each `*_cases` yields (name, check) pairs; a check returns (ok, what happened).
"""

from __future__ import annotations

from policyc.client import operator_channel, with_token

import contextlib
import copy
import io
import json
import os
import re
import resource
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases"
Check = Callable[[], "tuple[bool, str]"]


def warm(cls: str) -> None:
    """Import (and start) what a class needs before the memory limit is set."""
    import policyc.onnxgate.validate  # noqa: F401
    from onnx.reference import ReferenceEvaluator  # noqa: F401

    if cls == "grpc":
        import grpc  # noqa: F401

        _server()
    if cls == "cli":
        import policyc.cli.main  # noqa: F401
    if cls == "modelserver":  # real model servers, started before the runner limits its memory
        import corpus_modelserver

        corpus_modelserver.warm()


# ====================================================================== ONNX

def _scorer_json() -> str:
    from policyc.compiler.pipeline import compile_paths
    from policyc.onnxgate.contract_metadata import canonical_json

    r = compile_paths([str(CASES / "contract" / "base.contract")], analyse=False)
    assert r.ok and r.bundle is not None
    c = r.bundle.contract("scorer")
    assert c is not None
    return canonical_json(c)


def _const(name: str, value: Any) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=np.int64), name))


def _model(kind: str, spec: dict[str, Any]) -> onnx.ModelProto:
    dims = spec.get("dims", [1, "tokens", 64])
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.ones((64, 64), dtype=np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"])]
    outputs, inits = [y], [w]
    n = spec.get("n", 0)
    extra = helper.make_tensor_value_info("Z", TensorProto.INT64, None)
    if kind == "range":
        nodes += [_const("s", 0), _const("l", n), _const("d", spec.get("delta", 1)), helper.make_node("Range", ["s", "l", "d"], ["Z"])]
        outputs.append(extra)
    elif kind == "constant_of_shape":
        nodes += [_const("shape", [n, n]), helper.make_node("ConstantOfShape", ["shape"], ["Z"],
                                                            value=numpy_helper.from_array(np.zeros(1, dtype=np.int64)))]
        outputs.append(extra)
    elif kind == "expand":
        nodes += [_const("one", [1]), _const("shape", [n, n]), helper.make_node("Expand", ["one", "shape"], ["Z"])]
        outputs.append(extra)
    elif kind == "tile":
        nodes += [_const("one", [[1]]), _const("reps", [n, n]), helper.make_node("Tile", ["one", "reps"], ["Z"])]
        outputs.append(extra)
    elif kind == "broadcast":
        inits += [numpy_helper.from_array(np.ones((n, 1), dtype=np.int64), "A"),
                  numpy_helper.from_array(np.ones((1, n), dtype=np.int64), "B")]
        nodes.append(helper.make_node("Add", ["A", "B"], ["Z"]))
        outputs.append(extra)
    graph = helper.make_graph(nodes, "case", [x], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", spec.get("opset", 17))], ir_version=9)


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    for p in parts[:-1]:
        data = data[p]
    data[parts[-1]] = value


def _embedded_text(c: dict[str, Any], base: str) -> str:
    fill = {"{digits5000}": "9" * 5000, "{deep100000}": "[" * 100_000 + "]" * 100_000, "{huge2mb}": '"' + "x" * 2_000_000 + '"'}
    if "text" in c:
        return fill.get(c["text"], c["text"])
    data = json.loads(base)
    for path, value in c.get("set", {}).items():
        _set(data, path, value)
    for path in c.get("delete", []):
        del data[path]
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    for old, new in c.get("raw", []):
        assert old in text, f"{c['name']}: `{old}` not in the contract JSON"
        text = text.replace(old, new)
    for k, v in fill.items():
        text = text.replace(k, v)
    return text


def _onnx_file(c: dict[str, Any], base: str, workdir: Path) -> str:
    from policyc.onnxgate.contract_metadata import CONTRACT_KEY, HASH_KEY, contract_hash

    f = c.get("file")
    path = workdir / f"{c['name']}.onnx"
    if f == "/dev/zero":
        return f
    if f == "fifo":
        os.mkfifo(path)
        return str(path)
    if f == "dir":
        path.mkdir()
        return str(path)
    if f == "missing":
        return str(path)
    if f in ("garbage", "empty", "truncated", "no_graph"):
        data = {"garbage": b"\x08\x07" + os.urandom(4096), "empty": b"",
                "truncated": _model("matmul", {}).SerializeToString()[:40],
                "no_graph": onnx.ModelProto(ir_version=9).SerializeToString()}[f]
        path.write_bytes(data)
        return str(path)
    model = _model(c.get("model", "matmul"), c)
    if "external" in c:  # the weight W kept in a file beside the model, or somewhere it must not be
        w = next(i for i in model.graph.initializer if i.name == "W")
        target = {"fifo": "w.fifo", "outside": "../../etc/passwd", "absolute": "/dev/zero", "dev-zero-link": "zero.bin",
                  "good": "w.bin"}[c["external"]]
        folder = workdir / c["name"]
        folder.mkdir()
        path = folder / "model.onnx"
        if c["external"] == "fifo":
            os.mkfifo(folder / target)
        elif c["external"] == "dev-zero-link":
            os.symlink("/dev/zero", folder / target)
        elif c["external"] == "good":
            (folder / target).write_bytes(w.raw_data)
        del w.external_data[:]
        for k, v in (("location", target), ("offset", "0"), ("length", str(len(w.raw_data)))):
            w.external_data.add(key=k, value=v)
        w.data_location = onnx.TensorProto.EXTERNAL
        w.ClearField("raw_data")
    if not c.get("no_contract"):
        text = _embedded_text(c, base)
        recorded = contract_hash(base if c.get("stale_hash") else text)
        model.metadata_props.add(key=CONTRACT_KEY, value=text)
        if c.get("twice"):
            model.metadata_props.add(key=CONTRACT_KEY, value=text)
        if not c.get("drop_hash"):
            model.metadata_props.add(key=HASH_KEY, value=recorded)
    path.write_bytes(model.SerializeToString())
    return str(path)


def onnx_cases(workdir: Path) -> Iterator[tuple[str, Check]]:
    from policyc.onnxgate.validate import validate_model

    base = _scorer_json()
    spec = json.loads((CASES / "onnx" / "cases.json").read_text(encoding="utf-8"))
    for c in spec["cases"]:
        def check(c: dict[str, Any] = c) -> tuple[bool, str]:
            report = validate_model(_onnx_file(c, base, workdir), run=bool(c.get("run")))
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            if "max_rss_mib" in c and peak > c["max_rss_mib"]:
                return False, f"MEMORY: the process grew to {peak:.0f} MiB (bound {c['max_rss_mib']} MiB for this case)"
            want = c["verdict"] if isinstance(c["verdict"], list) else [c["verdict"]]
            got = f"{report.verdict.value}: {report.message[:300]}"
            if report.verdict.value not in want:
                return False, f"expected {want}; got {got}"
            if c.get("message") and c["message"] not in report.message:
                return False, f"expected `{c['message']}`; got {got}"
            return True, got
        yield c["name"], check


# ====================================================================== gRPC

_SERVED: list[Any] = []


def _server() -> Any:
    if _SERVED:
        return _SERVED[0]
    from policyc.compiler.pipeline import compile_paths
    from policyc.server.app import DecisionServer, ServerThread
    from policyc.server.config import ClusterSpec, EnforcerMode, ServeConfig

    r = compile_paths([str(HERE.parents[1] / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    cfg = ServeConfig(cluster=ClusterSpec(seed=1, hosts=4, gpus_per_host=2, hosts_per_rack=2), start_refresher=False,
                      enforcer=EnforcerMode.OFF)
    th = ServerThread(DecisionServer(r.bundle, cfg))
    th.start()
    _SERVED.append(th)
    return th


def _request(method: str, c: dict[str, Any]) -> bytes:
    from google.protobuf import json_format

    from policyc.server.proto import pb

    if "raw_hex" in c:
        return bytes.fromhex(c["raw_hex"])
    types = {"Decide": pb.DecideRequest, "Explain": pb.DecideRequest, "RegisterInstance": pb.RegisterInstanceRequest,
             "DeregisterInstance": pb.DeregisterInstanceRequest, "ReloadBundle": pb.ReloadBundleRequest}
    fill = {"{mb}": "i" * 1_000_000, "{kb8}": "v" * 8192, "{deep}": "[" * 100_000 + "]" * 100_000, **_FILES}
    body = json.loads(json.dumps(c.get("request", {})), object_hook=lambda d: {k: fill.get(v, v) if isinstance(v, str) else v
                                                                               for k, v in d.items()})
    msg = json_format.ParseDict(body, types[method]())
    raw = msg.SerializeToString()
    if c.get("corrupt_utf8"):  # a string field holding bytes that are not UTF-8
        raw = raw.replace(c["corrupt_utf8"].encode(), b"\xff\xfe" + c["corrupt_utf8"].encode()[2:], 1)
    return raw


_FILES: dict[str, str] = {}


def grpc_cases(workdir: Path) -> Iterator[tuple[str, Check]]:
    import grpc

    from policyc.compiler import bundle_io
    from policyc.server.proto import SERVICE_NAME

    th = _server()
    fifo = workdir / "reload.fifo"
    os.mkfifo(fifo)
    b = th.server.state.bundle
    c0 = b.contracts[0]
    bad = b.model_copy(update={"contracts": (c0.model_copy(update={"compute": c0.compute.model_copy(update={"tokens": 0})}),)
                               + b.contracts[1:]})
    _FILES.update({"{fifo}": str(fifo), "{rehashed}": bundle_io.dumps(bundle_io.seal(bad))})
    _FILES["{api_endpoint}"] = f"127.0.0.1:{th.server.port}"
    options = [("grpc.max_send_message_length", 64 << 20)]
    operator = operator_channel(f"127.0.0.1:{th.server.port}", options=options)  # the token the service keeps
    anonymous = grpc.insecure_channel(f"127.0.0.1:{th.server.port}", options=options)
    spec = json.loads((CASES / "grpc" / "cases.json").read_text(encoding="utf-8"))
    for c in spec["cases"]:
        def check(c: dict[str, Any] = c) -> tuple[bool, str]:
            method = c["method"]
            who = c.get("as", "operator")
            channel = operator if who == "operator" else anonymous if who == "anonymous" \
                else with_token(anonymous, who.removeprefix("token:"))
            call = channel.unary_unary(f"/{SERVICE_NAME}/{method}", request_serializer=None, response_deserializer=None)
            try:
                call(_request(method, c), timeout=10)
            except grpc.RpcError as e:
                code, details = e.code().name, e.details() or ""
                md = list(e.trailing_metadata() or ())
                got = f"{code}: {details[:300]}"
                if any(not re.fullmatch(r"[\x20-\x7e]*", str(v)) for _, v in md if isinstance(v, str)):
                    return False, f"trailing metadata holds raw input: {md[:3]}"
                if code != c["code"]:
                    return False, f"expected {c['code']}; got {got}"
                if c.get("message") and c["message"] not in details:
                    return False, f"expected `{c['message']}`; got {got}"
                return True, got
            return c["code"] == "OK", "OK"
        yield c["name"], check


# ====================================================================== CLI

def _cli_files(workdir: Path) -> dict[str, str]:
    from policyc.compiler import bundle_io
    from policyc.compiler.pipeline import compile_paths

    out: dict[str, str] = {}
    fifo = workdir / "cli.fifo"
    os.mkfifo(fifo)
    out["{fifo}"] = str(fifo)
    out["{zero}"] = "/dev/zero"
    (workdir / "emptydir").mkdir()
    out["{dir}"] = str(workdir / "emptydir")
    out["{missing}"] = str(workdir / "absent.json")
    r = compile_paths([str(CASES / "contract" / "base.contract")], analyse=False)
    assert r.bundle is not None
    good = workdir / "good.json"
    bundle_io.write(r.bundle, good)
    out["{bundle}"] = str(good)
    c0 = r.bundle.contracts[0]
    bad = r.bundle.model_copy(update={"contracts": (c0.model_copy(update={"compute": c0.compute.model_copy(update={"efficiency": -1.0})}),)
                                      + r.bundle.contracts[1:]})
    rehashed = workdir / "rehashed.json"
    bundle_io.write(bundle_io.seal(bad), rehashed)
    out["{rehashed}"] = str(rehashed)
    garbage = workdir / "garbage.bin"
    garbage.write_bytes(b"\xff\x00" * 512)
    out["{garbage}"] = str(garbage)
    big = workdir / "big.contract"
    with open(big, "wb") as f:
        f.truncate(9 * 1024 * 1024)
    out["{big}"] = str(big)
    contract = workdir / "c.contract"
    contract.write_text((CASES / "contract" / "base.contract").read_text())
    out["{contract}"] = str(contract)
    pem = workdir / "bad.pem"
    pem.write_text("not a certificate\n")
    out["{badpem}"] = str(pem)
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pub = workdir / "op.pub"
    pub.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    out["{pub}"] = str(pub)
    out["{outdir}"] = str(workdir)
    return out


def cli_cases(workdir: Path) -> Iterator[tuple[str, Check]]:
    from policyc.cli.main import main

    files = _cli_files(workdir)
    spec = json.loads((CASES / "cli" / "cases.json").read_text(encoding="utf-8"))
    for c in spec["cases"]:
        def check(c: dict[str, Any] = c) -> tuple[bool, str]:
            argv = [files.get(a, a) for a in c["argv"]]
            argv = [re.sub(r"\{\w+\}", lambda m: files.get(m.group(0), m.group(0)), a) for a in argv]
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(copy.copy(argv))
                except SystemExit as e:
                    rc = int(e.code) if isinstance(e.code, int) else 2
            text = out.getvalue() + err.getvalue()
            got = f"exit {rc}: {text.strip()[-300:]}"
            if "Traceback" in text:
                return False, "TRACEBACK in output: " + text[-1500:]
            if rc not in c["exit"]:
                return False, f"expected exit {c['exit']}; got {got}"
            if c.get("message") and c["message"] not in text:
                return False, f"expected `{c['message']}`; got {got}"
            return True, got
        yield c["name"], check


def service_cases(cls: str, workdir: Path) -> Iterator[tuple[str, Check]]:
    if cls == "modelserver":
        from corpus_modelserver import modelserver_cases

        return modelserver_cases(workdir)
    return {"onnx": onnx_cases, "grpc": grpc_cases, "cli": cli_cases}[cls](workdir)
