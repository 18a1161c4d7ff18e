"""Real KServe model servers on loopback serving real ONNX models: answers over v2 gRPC and
REST equal onnxruntime's, say which instance answered, a stalled request holds only its own
stream, the backup serves its simplified variant to a retry, bad requests get clear errors,
and the processes stop cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from modelserver_support import BACKUP, PRIMARY, PRIMARY_LITE, REPLICA
from policyc.modelserver import wire
from policyc.modelserver.client import OipClient, answer_of, parse_rest_answer, rest_body, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ModelServerError, ServerSpec
from policyc.modelserver.model_files import ModelFiles
from policyc.modelserver.oip import InferenceStub, pb
from policyc.onnxgate.reference_models import TransformerSpec, build_transformer


def _direct(path: Path, ids: np.ndarray) -> np.ndarray:
    (out,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["logits"], {"input_ids": ids})
    return np.asarray(out)


def _post(endpoint: str, model: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(f"http://{endpoint}/v2/models/{model}/infer", data=body,
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def _metric(endpoint: str, name: str, instance: str) -> float:
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{") and f'instance="{instance}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _connections_to(port: int) -> int:
    """Established TCP connections on this machine whose remote end is `port` (our clients)."""
    n = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.read().splitlines()[1:]:
                cols = row.split()
                if cols[3] == "01" and int(cols[2].rsplit(":", 1)[1], 16) == port:
                    n += 1
    return n


def test_grpc_answers_equal_onnxruntime_and_name_the_instance(pool: ModelPool, model_files: dict[str, ModelFiles]) -> None:
    ids = token_ids(24, batch=2, seed=3)
    for iid, model, path in ((PRIMARY, "fraud-scorer", model_files["fraud-scorer"].full),
                             (PRIMARY_LITE, "fraud-scorer-lite", model_files["fraud-scorer-lite"].full)):
        inst = pool.instance(iid)
        with OipClient(inst.endpoint) as c:
            a = c.infer(model, ids, request_id="req-7", metadata=[(wire.DECISION_ID, "dec-42")])
        assert (a.instance, a.variant, a.model, a.request_id, a.decision_id) == (iid, wire.FULL, model, "req-7", "dec-42")
        assert a.headers[wire.INSTANCE] == iid and a.headers[wire.VARIANT] == wire.FULL
        assert a.compute_us > 0 and a.headers[wire.COMPUTE_US] == str(a.compute_us)
        assert a.logits.shape == (2, 24, 256)
        np.testing.assert_allclose(a.logits, _direct(path, ids), rtol=1e-5, atol=1e-5)
    # one process, three instances (two replicas of one model among them), three endpoints
    assert len({pool.endpoint(i) for i in (PRIMARY, PRIMARY_LITE, REPLICA)}) == 3
    assert len({pool.instance(i).http_endpoint for i in (PRIMARY, PRIMARY_LITE, REPLICA)}) == 1
    with OipClient(pool.endpoint(REPLICA)) as c:
        assert c.infer("fraud-scorer", ids).instance == REPLICA


def test_grpc_typed_contents_are_read_too(pool: ModelPool, model_files: dict[str, ModelFiles]) -> None:
    ids = token_ids(5, seed=1)
    tensor = pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[1, 5],
                                                   contents=pb.InferTensorContents(int64_contents=ids.ravel().tolist()))
    with grpc.insecure_channel(pool.endpoint(PRIMARY)) as ch:
        r = InferenceStub(ch).ModelInfer(pb.ModelInferRequest(model_name="fraud-scorer", inputs=[tensor]))
    logits = np.frombuffer(r.raw_output_contents[0], dtype=np.float32).reshape(list(r.outputs[0].shape))
    np.testing.assert_allclose(logits, _direct(model_files["fraud-scorer"].full, ids), rtol=1e-5, atol=1e-5)
    assert r.parameters[wire.PARAM_INSTANCE].string_param == PRIMARY


def test_rest_answers_equal_onnxruntime_and_name_the_instance(pool: ModelPool, model_files: dict[str, ModelFiles]) -> None:
    ids = token_ids(9, seed=5)
    inst = pool.instance(PRIMARY_LITE)
    assert inst.on_rest
    status, headers, body = _post(inst.http_endpoint, "fraud-scorer-lite", rest_body(ids, request_id="r-1"))
    assert status == 200, body
    a = parse_rest_answer(body, headers)
    assert (a.instance, a.variant, a.request_id) == (PRIMARY_LITE, wire.FULL, "r-1")
    assert headers[wire.INSTANCE] == PRIMARY_LITE and int(headers[wire.COMPUTE_US]) == a.compute_us > 0
    np.testing.assert_allclose(a.logits, _direct(model_files["fraud-scorer-lite"].full, ids), rtol=1e-5, atol=1e-5)
    # two instances of the process answer fraud-scorer: REST cannot say which, so it serves neither
    assert not pool.instance(PRIMARY).on_rest and not pool.instance(REPLICA).on_rest
    status, _, body = _post(inst.http_endpoint, "fraud-scorer", rest_body(ids))
    assert status == 404 and "fraud-scorer" in body.decode()
    # the backup's process serves its model and its alias on REST, the retry header included
    status, headers, body = _post(pool.instance(BACKUP).http_endpoint, "fraud-scorer", rest_body(ids),
                                  {"X-Retry-Count": "1"})
    assert status == 200 and parse_rest_answer(body, headers).variant == wire.SIMPLIFIED


def test_readiness_and_model_metadata(pool: ModelPool) -> None:
    with OipClient(pool.endpoint(BACKUP)) as c:
        assert c.server_ready() and c.model_ready("fraud-scorer-lite") and c.model_ready("fraud-scorer")
        with pytest.raises(grpc.RpcError) as e:
            c.model_ready("recommender")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        meta = c.stub.ModelMetadata(pb.ModelMetadataRequest(name="fraud-scorer-lite"))
        assert [(t.name, t.datatype) for t in meta.inputs] == [("input_ids", "INT64")]
    # an instance's own port serves its model only: the gateway's ip:port reaches exactly it
    with OipClient(pool.endpoint(PRIMARY)) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.infer("fraud-scorer-lite", token_ids(3))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with urllib.request.urlopen(f"http://{pool.instance(BACKUP).http_endpoint}/v2/health/ready", timeout=5) as r:
        assert json.loads(r.read())["ready"] is True


def test_a_stall_holds_only_its_own_stream(pool: ModelPool) -> None:
    """Four concurrent calls on one channel (one HTTP/2 connection): the stalled one is held
    until its caller resets it (deadline → RST_STREAM); the three siblings answer at once,
    and the connection carries the next call."""
    inst = pool.instance(PRIMARY)
    port = int(inst.endpoint.rsplit(":", 1)[1])
    cancelled = _metric(inst.http_endpoint, "policyc_modelserver_cancelled_total", PRIMARY)
    with OipClient(inst.endpoint) as c:
        c.infer("fraud-scorer", token_ids(4))  # connect first
        assert _connections_to(port) == 1
        t = time.monotonic()
        # its deadline (3 s) is the room the siblings have on a loaded machine to show they were not held behind it
        stalled = c.infer_future("fraud-scorer", token_ids(16, seed=9), metadata=[(wire.STALL_MS, "10000")], timeout=3.0)
        siblings = [c.infer_future("fraud-scorer", token_ids(16, seed=k), timeout=5) for k in range(3)]
        answers = [answer_of(f) for f in siblings]
        siblings_done = time.monotonic() - t
        assert all(a.instance == PRIMARY and a.stalled_ms == 0 for a in answers)
        assert siblings_done < 3.0 and not stalled.done(), siblings_done
        with pytest.raises(grpc.RpcError) as e:
            answer_of(stalled)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert 2.95 < time.monotonic() - t < 9.0
        after = c.infer("fraud-scorer", token_ids(4))
        assert after.instance == PRIMARY and _connections_to(port) == 1
    deadline = time.monotonic() + 15
    while _metric(inst.http_endpoint, "policyc_modelserver_cancelled_total", PRIMARY) < cancelled + 1:
        assert time.monotonic() < deadline, "the server did not see the stalled stream reset"
        time.sleep(0.05)
    assert _metric(inst.http_endpoint, "policyc_modelserver_cancelled_total", PRIMARY) == cancelled + 1


def test_a_stall_that_runs_out_is_answered_with_its_hold(pool: ModelPool) -> None:
    with OipClient(pool.endpoint(PRIMARY_LITE)) as c:
        t = time.monotonic()
        a = c.infer("fraud-scorer-lite", token_ids(8), metadata=[(wire.STALL_MS, "150")])
    assert a.stalled_ms == 150 and time.monotonic() - t >= 0.15
    assert a.headers[wire.STALLED_MS] == "150"


def test_stall_needs_stall_control_and_never_holds_a_retry(pool: ModelPool) -> None:
    with OipClient(pool.endpoint(BACKUP)) as c:  # started without stall control: the header is not even read
        a = c.infer("fraud-scorer-lite", token_ids(8), metadata=[(wire.STALL_MS, "3000")], timeout=2)
        b = c.infer("fraud-scorer-lite", token_ids(8), metadata=[(wire.STALL_MS, "soon")], timeout=2)
    assert a.stalled_ms == 0 and b.stalled_ms == 0
    with OipClient(pool.endpoint(PRIMARY_LITE)) as c, pytest.raises(grpc.RpcError) as e:  # stall control on
        c.infer("fraud-scorer-lite", token_ids(8), metadata=[(wire.STALL_MS, "soon")], timeout=2)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-policyc-stall-ms" in (e.value.details() or "")
    with OipClient(pool.endpoint(PRIMARY)) as c:  # stall control on, but a retry is not stalled
        a = c.infer("fraud-scorer", token_ids(8), metadata=[(wire.STALL_MS, "3000"), (wire.RETRY_COUNT, "1")], timeout=2)
    assert a.stalled_ms == 0 and a.retry_count == 1 and a.variant == wire.FULL  # no simplified variant there


def test_the_backup_serves_its_simplified_variant_to_a_retry(pool: ModelPool, model_files: dict[str, ModelFiles]) -> None:
    ids = token_ids(12, seed=11)
    lite = model_files["fraud-scorer-lite"]
    assert lite.simplified is not None
    with OipClient(pool.endpoint(BACKUP)) as c:
        # the primary's request body (model fraud-scorer) retried with the contract's header
        retried = c.infer("fraud-scorer", ids, metadata=[("x-retry-count", "1")])
        by_envoy = c.infer("fraud-scorer", ids, metadata=[(wire.ENVOY_ATTEMPT_COUNT, "2")])
        first = c.infer("fraud-scorer-lite", ids)
        with pytest.raises(grpc.RpcError) as e:
            c.infer("fraud-scorer", ids, metadata=[("x-retry-count", "one")])
    assert (retried.instance, retried.variant, retried.retry_count, retried.model) == (BACKUP, wire.SIMPLIFIED, 1, "fraud-scorer-lite")
    assert retried.headers[wire.VARIANT] == wire.SIMPLIFIED and retried.headers[wire.RETRY_SEEN] == "1"
    np.testing.assert_allclose(retried.logits, _direct(lite.simplified, ids), rtol=1e-5, atol=1e-5)
    assert (by_envoy.variant, by_envoy.retry_count) == (wire.SIMPLIFIED, 1)
    assert (first.variant, first.retry_count) == (wire.FULL, 0)
    np.testing.assert_allclose(first.logits, _direct(lite.full, ids), rtol=1e-5, atol=1e-5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "x-retry-count" in (e.value.details() or "")
    # the simplified model is a smaller real model, not the full one renamed
    assert len(onnx.load_model(str(lite.simplified)).graph.node) < len(onnx.load_model(str(lite.full)).graph.node)


@pytest.mark.parametrize("tensor, message", [
    (pb.ModelInferRequest.InferInputTensor(name="tokens", datatype="INT64", shape=[1, 2],
                                           contents=pb.InferTensorContents(int64_contents=[1, 2])),
     "takes one input `input_ids`, got `tokens`"),
    (pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="FP32", shape=[1, 2],
                                           contents=pb.InferTensorContents(fp32_contents=[1, 2])),
     "datatype must be INT64, got FP32"),
    (pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[1, 3],
                                           contents=pb.InferTensorContents(int64_contents=[1, 2, 999])),
     "token ids must be in [0, 256), got 1 .. 999"),
    (pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[3],
                                           contents=pb.InferTensorContents(int64_contents=[1, 2, 3])),
     "shape must be [batch, sequence], got [3]"),
    (pb.ModelInferRequest.InferInputTensor(name="input_ids", datatype="INT64", shape=[1, 129],
                                           contents=pb.InferTensorContents(int64_contents=[1] * 129)),
     "sequence of 129 is longer than 128"),  # the model takes its contract's 128 tokens in one sequence
])
def test_a_malformed_grpc_request_gets_a_clear_error(pool: ModelPool, tensor: pb.ModelInferRequest.InferInputTensor,
                                                     message: str) -> None:
    with grpc.insecure_channel(pool.endpoint(PRIMARY)) as ch:
        with pytest.raises(grpc.RpcError) as e:
            InferenceStub(ch).ModelInfer(pb.ModelInferRequest(model_name="fraud-scorer", inputs=[tensor]),
                                                            timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (e.value.details() or "")


def test_a_malformed_rest_request_gets_a_clear_error(pool: ModelPool) -> None:
    http = pool.instance(PRIMARY).http_endpoint
    status, _, body = _post(http, "fraud-scorer-lite", b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, -4]}]}')
    assert status == 400 and "token ids must be in [0, 256), got -4 .. 1" in json.loads(body)["error"]
    status, _, body = _post(http, "fraud-scorer-lite", b"{not json")
    assert status == 400 and "not JSON" in json.loads(body)["error"]  # the REST guard's, before FastAPI parses it
    status, _, body = _post(http, "no-such-model", rest_body(token_ids(2)))
    assert status == 404 and "no-such-model" in body.decode()


def test_a_server_that_cannot_serve_fails_its_start_with_the_reason(tmp_path: Path) -> None:
    bare = tmp_path / "bare.onnx"
    onnx.save_model(build_transformer(TransformerSpec(vocab=8, d_model=4, heads=1, layers=1, d_ff=8, max_len=4)), str(bare))
    spec = ServerSpec((InstanceSpec("x@h/g", bare, name="x"),))
    t = time.monotonic()
    with pytest.raises(ModelServerError) as e:
        ModelPool([spec], workdir=tmp_path / "pool").start(timeout=30)
    assert "no embedded contract" in str(e.value) and "policyc.contract" in str(e.value)
    assert time.monotonic() - t < 15


def test_command_line_errors_are_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "policyc.modelserver", "--grpc-port", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "no model to serve" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "modelserver", "--model", str(tmp_path / "none.onnx")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "none.onnx" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "policyc.cli.main", "modelserver", "--instance", "x@h/g"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "comes before any --model" in r.stderr and "Traceback" not in r.stderr


def test_stopping_leaves_no_process(model_files: dict[str, ModelFiles], tmp_path: Path) -> None:
    pool = ModelPool([ServerSpec((InstanceSpec("one@h/g", model_files["fraud-scorer"].full),))], workdir=tmp_path).start()
    pids = [p.pid for p in pool.processes]
    with OipClient(pool.endpoint("one@h/g")) as c:
        assert c.infer("fraud-scorer", token_ids(2)).instance == "one@h/g"
    pool.stop()
    assert [p.stop() for p in pool.processes] == [0]
    assert not any(pid is not None and os.path.exists(f"/proc/{pid}") for pid in pids)


def test_a_forked_pool_stops_one_server_alone_and_reports_a_bad_one(model_files: dict[str, ModelFiles],
                                                                     tmp_path: Path) -> None:
    """Several processes come from one zygote (KServe imported once): each is its own
    process, stopped alone; one that cannot serve fails the pool's start with its reason."""
    full = model_files["fraud-scorer"].full
    pool = ModelPool([ServerSpec((InstanceSpec("a@h/g", full),)), ServerSpec((InstanceSpec("b@h/g", full),))],
                     workdir=tmp_path / "ok").start()
    assert pool._zygote is not None
    pids = [p.pid for p in pool.processes]
    assert len(set(pids)) == 2 and pool._zygote.pid not in pids
    assert pool.process_of("a@h/g").stop() == 0
    with OipClient(pool.endpoint("b@h/g")) as c:
        assert c.infer("fraud-scorer", token_ids(2)).instance == "b@h/g"
    with OipClient(pool.endpoint("a@h/g")) as c, pytest.raises(grpc.RpcError) as e:
        c.infer("fraud-scorer", token_ids(2), timeout=2)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    pool.stop()
    assert pool._zygote.returncode == 0
    assert not any(pid is not None and os.path.exists(f"/proc/{pid}") for pid in [*pids, pool._zygote.pid])

    bare = tmp_path / "bare.onnx"
    onnx.save_model(build_transformer(TransformerSpec(vocab=8, d_model=4, heads=1, layers=1, d_ff=8, max_len=4)), str(bare))
    bad = ModelPool([ServerSpec((InstanceSpec("x@h/g", bare, name="x"),)), ServerSpec((InstanceSpec("a@h/g", full),))],
                    workdir=tmp_path / "bad")
    with pytest.raises(ModelServerError) as err:
        bad.start(timeout=30)
    assert "no embedded contract" in str(err.value)
    assert bad._zygote is not None and bad._zygote.poll() is not None
    assert not any(p.running for p in bad.processes)


def test_the_client_side_needs_no_kserve_import_and_speaks_its_types() -> None:
    """The OIP messages come from KServe's generated file without importing the package;
    importing KServe afterwards gives the very same classes."""
    code = ("import sys; from policyc.modelserver import client, launcher; assert 'kserve' not in sys.modules; "
            "from policyc.modelserver.oip import pb; "
            "from kserve.protocol.grpc import grpc_predict_v2_pb2 as real; "
            "assert pb.ModelInferRequest is real.ModelInferRequest and pb.ModelInferResponse is real.ModelInferResponse; "
            "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
