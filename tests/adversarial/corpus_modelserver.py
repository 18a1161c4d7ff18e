"""The `modelserver` class of the adversarial corpus: hostile inference requests
(`cases/modelserver/cases.json`) against real KServe model-server processes on loopback.

`warm` (before the runner limits its own memory) starts a pool of two processes:
`main` — fraud-scorer (`fs@host-01/gpu0`) and a sibling instance (`other@host-01/gpu1`)
in one process, as a host's several instances share one — and `tight`, fraud-scorer
with `--max-answer-bytes 65536`. A background client calls the sibling every 100 ms,
over gRPC and REST in turn, for the whole run. Each case sends one request and checks
the status and message it gets; then that the server process still runs and that its
peak resident memory (`VmHWM` from /proc, since the warm-up) grew by no more than its
declared bounds (the largest request body or gRPC message it takes, plus the largest
answer it sends, as its ready file states them) plus 64 MiB. Three closing checks: the
sibling was answered throughout (no error, every call within 10 s), the server's log
holds no traceback and one line per refusal, and the pool stops cleanly (exit 0).
"""

from __future__ import annotations

import http.client
import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases" / "modelserver" / "cases.json"
Check = Callable[[], "tuple[bool, str]"]

MODEL = "fraud-scorer"
MAIN, SIBLING, TIGHT = "fs@host-01/gpu0", "other@host-01/gpu1", "fs@host-02/gpu0"
SLACK = 64 << 20  # what a request may add to the declared bounds (the promise)
SIBLING_CALL_S = 10.0  # the slowest the background client may be answered (a loaded 2-core machine)

_STATE: dict[str, Any] = {}


def warm() -> None:
    """Start the pool and the background client (before the runner's memory limit)."""
    import grpc  # noqa: F401

    from policyc.compiler.pipeline import compile_paths
    from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
    from policyc.modelserver.model_files import write_model_files

    r = compile_paths([str(HERE.parents[1] / "policies")], analyse=False)
    assert r.ok and r.bundle is not None
    contract = r.bundle.contract(MODEL)
    assert contract is not None
    tmp = Path(tempfile.mkdtemp(prefix="policyc-corpus-modelserver-"))
    files = write_model_files(contract, tmp / "models")
    pool = ModelPool([
        ServerSpec((InstanceSpec(MAIN, files.full), InstanceSpec(SIBLING, files.full, name="other"))),
        ServerSpec((InstanceSpec(TIGHT, files.full),), max_answer_bytes=65536),
    ], workdir=tmp / "pool").start(timeout=90)
    _STATE.update(pool=pool, tmp=tmp)
    for server, iid in (("main", MAIN), ("tight", TIGHT)):
        proc = pool.process_of(iid)
        facts = json.loads(proc.ready_file.read_text())
        bounds = next(i["bounds"] for i in facts["instances"] if i["instance"] == iid)
        declared = max(bounds["rest_body_bytes"], bounds["grpc_max_receive"]) + bounds["max_answer_bytes"]
        _STATE[server] = {"proc": proc, "pid": proc.pid, "http": proc.http_endpoint, "grpc": pool.endpoint(iid),
                          "declared": declared}
        # warm-up at the largest legal request, both ways, before the baseline
        _send({"via": "rest", "shape": [2, 64], "data": "valid", "server": server})
        _send({"via": "grpc", "shape": [2, 64], "data": "valid", "server": server})
        _STATE[server]["baseline"] = _hwm(_STATE[server]["pid"])
    _STATE["sibling"] = _Sibling(pool.endpoint(SIBLING), _STATE["main"]["http"])
    _STATE["sibling"].start()


class _Sibling(threading.Thread):
    """Calls the sibling instance every 100 ms (gRPC and REST in turn), recording each call."""

    def __init__(self, grpc_endpoint: str, http_endpoint: str) -> None:
        super().__init__(name="corpus-sibling", daemon=True)
        self.grpc_endpoint, self.http_endpoint = grpc_endpoint, http_endpoint
        self.stop = threading.Event()
        self.calls: list[tuple[str, float, str]] = []  # (via, seconds, error or "")

    def run(self) -> None:
        from policyc.modelserver.client import OipClient, rest_body, token_ids

        with OipClient(self.grpc_endpoint) as c:
            n = 0
            while not self.stop.is_set():
                via = "grpc" if n % 2 == 0 else "rest"
                n += 1
                t = time.monotonic()
                err = ""
                try:
                    if via == "grpc":
                        c.infer("other", token_ids(16, seed=n), timeout=30)
                    else:
                        status, _ = _http(self.http_endpoint, "POST", "/v2/models/other/infer", rest_body(token_ids(16)), {})
                        err = "" if status == 200 else f"HTTP {status}"
                except Exception as e:  # noqa: BLE001 - any failure of the sibling is the finding
                    err = f"{type(e).__name__}: {str(e)[:200]}"
                self.calls.append((via, time.monotonic() - t, err))
                self.stop.wait(0.1)


def _hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def _fill(text: str) -> str:
    fills = {"{digits5000}": "9" * 5000, "{ones1000}": ", ".join(["1"] * 1000), "{deep100}": "[" * 100,
             "{undeep100}": "]" * 100, "{deep60000}": "[" * 60000}
    for k, v in fills.items():
        text = text.replace(k, v)
    return text


def _ids(shape: list[int]) -> np.ndarray:
    return np.random.default_rng(7).integers(0, 256, size=shape, dtype=np.int64)


def _http(endpoint: str, method: str, path: str, body: bytes, headers: dict[str, str],
          chunked: bool = False) -> tuple[int, bytes]:
    host, port = endpoint.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        hdrs = {"content-type": "application/json", **headers}
        if chunked:
            conn.putrequest(method, path)
            for k, v in {**hdrs, "transfer-encoding": "chunked"}.items():
                conn.putheader(k, v)
            conn.endheaders()
            try:
                for i in range(0, len(body), 16384):
                    part = body[i:i + 16384]
                    conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server answered (413) and closed before the whole body was sent
        else:
            conn.request(method, path, body=body, headers=hdrs)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def _rest_body(c: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    headers = {k: _fill(v) for k, v in c.get("headers", {}).items()}
    if "raw_hex" in c:
        return bytes.fromhex(c["raw_hex"]), headers
    if "raw" in c:
        return _fill(c["raw"]).encode(), headers
    if "body" in c:
        return json.dumps(c["body"]).encode(), headers
    if "binary" in c:
        b = c["binary"]
        head = json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": b["shape"],
                                       "parameters": {"binary_data_size": b["size"]}}]}).encode()
        headers["inference-header-content-length"] = str(len(head))
        return head + bytes(b["send"]), headers
    ids = _ids(c["shape"])
    return json.dumps({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": c["shape"],
                                   "data": ids.ravel().tolist()}]}).encode(), headers


def _grpc_request(c: dict[str, Any]) -> Any:
    from policyc.modelserver.oip import pb

    tensor = pb.ModelInferRequest.InferInputTensor(name=c.get("input_name", "input_ids"), datatype=c.get("datatype", "INT64"),
                                                   shape=c.get("shape", []))
    req = pb.ModelInferRequest(model_name=c.get("model", MODEL))
    data = c.get("data")
    if data == "valid":
        req.raw_input_contents.append(_ids(c["shape"]).tobytes())
    elif data == "contents":
        tensor.contents.int64_contents.extend(_ids(c["shape"]).ravel().tolist())
    elif isinstance(data, list):
        tensor.contents.int64_contents.extend(data)
    if "raw_bytes" in c:
        req.raw_input_contents.append(bytes(c["raw_bytes"]))
    if "fp32" in c:
        tensor.contents.fp32_contents.extend(c["fp32"])
    req.inputs.append(tensor)
    return req


def _send(c: dict[str, Any]) -> tuple[str, str]:
    """Send one case's request; (status or code name, message)."""
    server = _STATE[c.get("server", "main")]
    if c["via"] == "rest":
        body, headers = _rest_body(c)
        status, answer = _http(server["http"], "POST", c.get("path", f"/v2/models/{c.get('model', MODEL)}/infer"), body,
                               headers, chunked=bool(c.get("chunked")))
        try:
            message = str(json.loads(answer).get("error", "")) if status != 200 else ""
        except (ValueError, AttributeError):
            message = answer[:300].decode("utf-8", "replace")
        return str(status), message
    import grpc

    from policyc.modelserver.oip import SERVICE, pb

    method = c.get("method", "ModelInfer")
    request = _grpc_request(c) if method == "ModelInfer" else getattr(pb, f"{method}Request")(model_name=MODEL)
    with grpc.insecure_channel(server["grpc"], options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        call = ch.unary_unary(f"/{SERVICE}/{method}", request_serializer=lambda m: m.SerializeToString(),
                              response_deserializer=lambda b: b)
        try:
            call(request, timeout=30, metadata=[(k, _fill(v)) for k, v in c.get("metadata", [])])
            return "OK", ""
        except grpc.RpcError as e:
            return e.code().name, e.details() or ""


def _flood(c: dict[str, Any]) -> tuple[str, str]:
    """Many legal requests of the largest size at once, both ways: every one answered."""
    from concurrent.futures import ThreadPoolExecutor

    one = {"shape": c["shape"], "data": "valid", "server": c.get("server", "main")}
    jobs = [{**one, "via": "grpc"}] * c["grpc"] + [{**one, "via": "rest"}] * c["rest"]
    with ThreadPoolExecutor(max_workers=8) as pool:  # the runner's own address space is bounded
        got = list(pool.map(_send, jobs))
    failed = [g for g in got if g[0] not in ("OK", "200")]
    return ("OK", "") if not failed else ("FAILED", f"{len(failed)} of {len(got)}: {failed[:2]}")


def _check(c: dict[str, Any]) -> tuple[bool, str]:
    server = _STATE[c.get("server", "main")]
    got_status, message = _flood(c) if c["via"] == "flood" else _send(c)
    got = f"{got_status}: {message[:300]}"
    want = str(c["status"]) if c["via"] == "rest" else c["code"]  # a flood: "OK" when every request was answered
    if got_status != want:
        return False, f"expected {want}; got {got}"
    if c.get("message") and c["message"] not in message:
        return False, f"expected `{c['message']}`; got {got}"
    if not server["proc"].running:
        return False, f"the server died: {got}\n{server['proc'].log_tail(20)}"
    grown = _hwm(server["pid"]) - server["baseline"]
    if grown > server["declared"] + SLACK:
        return False, (f"MEMORY: the server's peak RSS grew {grown >> 20} MiB, over its declared "
                       f"{server['declared'] >> 20} MiB + 64 MiB: {got}")
    return True, f"{got} (server peak +{grown >> 20} MiB)"


def _sibling_answered() -> tuple[bool, str]:
    sib: _Sibling = _STATE["sibling"]
    time.sleep(0.5)  # a few more calls after the last attack: the server still answers both ways
    sib.stop.set()
    sib.join(timeout=60)
    calls = sib.calls
    failed = [(via, err) for via, _, err in calls if err]
    slowest = max((s for _, s, _ in calls), default=0.0)
    got = f"{len(calls)} calls to the sibling, {len(failed)} failed, slowest {slowest:.2f} s"
    if len(calls) < 4:
        return False, f"too few calls to judge: {got}"
    if failed:
        return False, f"{got}: {failed[:3]}"
    if slowest > SIBLING_CALL_S:
        return False, f"{got}: over {SIBLING_CALL_S} s (the event loop was held)"
    return True, got


def _log_is_one_line_per_refusal(refused: int) -> tuple[bool, str]:
    text = "\n".join(Path(_STATE[s]["proc"].log_path).read_text(errors="replace") for s in ("main", "tight"))
    if "Traceback" in text:
        i = text.index("Traceback")
        return False, "TRACEBACK in the server log: " + text[max(0, i - 300):i + 1500]
    lines = [line for line in text.splitlines() if " refused " in line]
    if len(lines) < refused:
        return False, f"{len(lines)} refusal lines in the log for {refused} refused requests"
    return True, f"{len(lines)} refusal lines for {refused} refused requests, no traceback"


def _pool_stops_cleanly() -> tuple[bool, str]:
    pool = _STATE["pool"]
    procs = [_STATE[s]["proc"] for s in ("main", "tight")]
    codes = [p.stop() for p in procs]  # SIGTERM, then the exit status
    pool.stop()
    return all(code == 0 for code in codes), f"exit codes {codes}"


def modelserver_cases(workdir: Path) -> Iterator[tuple[str, Check]]:
    spec = json.loads(CASES.read_text(encoding="utf-8"))
    refused = 0
    for c in spec["cases"]:
        ok_status = c.get("status") == 200 or c.get("code") == "OK"
        # gRPC's own refusal of an oversized message happens before any handler: not logged by us
        refused += 0 if ok_status or c.get("code") == "RESOURCE_EXHAUSTED" else 1
        yield c["name"], (lambda c=c: _check(c))
    yield "zz-the-sibling-was-answered-throughout", _sibling_answered
    yield "zz-server-log-one-line-per-refusal", (lambda: _log_is_one_line_per_refusal(refused))
    yield "zz-the-pool-stops-cleanly", _pool_stops_cleanly
