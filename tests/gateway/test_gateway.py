"""Through a real Envoy to real KServe model servers, with policyc as Envoy's ext_proc
endpoint picker (one gateway for the module: `gateway_support.gateway`)."""

from __future__ import annotations

import threading
import time
import urllib.request

import grpc
import pytest

from policyc.client import operator_channel
from policyc.compiler import bundle_io
from policyc.gateway.bootstrap import GatewaySpec, POOL_CLUSTER, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.modelserver.client import OipClient, answer_of, token_ids
from policyc.server.proto import pb, pb_grpc

from gateway_rig import BACKUP, PRIMARY, Gateway, free_port

IDS = token_ids(32)
BASE = (("x-model", PRIMARY), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"))
STALL = ("x-policyc-stall-ms", "5000")


def refused(client: OipClient, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        client.infer(PRIMARY, IDS, metadata=metadata, timeout=10)
    return info.value  # type: ignore[return-value]


def trailers(e: grpc.RpcError) -> dict[str, str]:
    return dict(e.trailing_metadata() or ())  # type: ignore[attr-defined]


def test_an_admitted_request_reaches_the_instance_the_picker_chose(gateway: Gateway, client: OipClient) -> None:
    a = client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
    pick = gateway.picker.picker.recent[a.decision_id]
    assert a.instance == pick.instance_id  # the model server names itself in its answer
    assert pick.endpoint == gateway.endpoint_of(pick.instance_id)
    assert pick.model == PRIMARY and a.variant == "full" and a.retry_count == 0
    assert a.headers["x-envoy-attempt-count"] == "1"
    # the fallback is the contract's redirect backup, and only instances with endpoints were candidates
    assert [m.model for m in pick.fallbacks] == [BACKUP]
    assert pick.breaker is not None and pick.per_try_timeout_ms is not None
    # the simulated fleet is registered too (placement at scale), but never gets gateway traffic
    assert len(gateway.server.engine.state.registry) > 100


def test_each_forwarded_pick_counts_in_flight_on_its_gpu_until_its_access_log_entry(gateway: Gateway,
                                                                                    client: OipClient) -> None:
    """The gateway in-flight signal on the real path (placer/signals/gateway_in_flight.py):
    the picker begins a count on the placer for every pick it forwards and the call's
    access-log entry ends it, leaving the request's measured duration on its GPU."""
    counts = gateway.picker.picker.in_flight_gpus
    assert counts is not None and counts is gateway.server.engine.placer.in_flight
    ids = [client.infer(PRIMARY, IDS, metadata=BASE, timeout=10).decision_id for _ in range(3)]
    deadline = time.monotonic() + 10
    while counts.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not counts.busy()  # every count ended with its access-log entry
    assert all(counts.end(d) is None for d in ids)  # ended already, once each
    assert counts.measured() and all(s > 0 for s in counts.measured().values())


def test_new_request_shapes_through_the_gateway_run_no_z3_on_the_serving_loop(gateway: Gateway, client: OipClient) -> None:
    feas = gateway.server.engine.state.feasibility
    before = feas.solves_background
    for ms in range(301, 313):  # twelve SLOs no request has used: new raw and typed shapes
        a = client.infer(PRIMARY, IDS, metadata=BASE + (("x-slo-latency", f"{ms}ms"),), timeout=10)
        assert a.instance
    assert feas.solves_on_loop == 0
    assert feas.solves_background > before  # the new feasibility shapes were solved in the solver thread


@pytest.mark.parametrize("metadata, code, words", [
    ((("x-data-regoin", "us-west"),), grpc.StatusCode.INVALID_ARGUMENT, ["x-data-regoin", "did you mean `X-Data-Region`"]),
    ((("x-data-region", "mars"),), grpc.StatusCode.INVALID_ARGUMENT, ["X-Data-Region", "`mars` is not one of"]),
    ((("x-tenant", "acme-bnk"),), grpc.StatusCode.INVALID_ARGUMENT, ["unknown tenant `acme-bnk`", "did you mean `acme-bank`"]),
    ((("x-slo-latency", "fast"),), grpc.StatusCode.INVALID_ARGUMENT, ["X-SLO-Latency", "`fast`"]),
    ((("x-retry-count", "-1"),), grpc.StatusCode.INVALID_ARGUMENT, ["x-retry-count", "whole number"]),
    ((("x-model", PRIMARY), ("x-tenant", "st-marys")), grpc.StatusCode.PERMISSION_DENIED,
     ["`compliance.healthcare-eu`", "`routing.pinned-model`"]),
    # the fleet has instances that may serve a healthcare request, none of them with an endpoint
    ((("x-tenant", "st-marys"),), grpc.StatusCode.UNAVAILABLE,
     ["satisfy the applicable rules, but none has an endpoint", "`compliance.healthcare-eu` (", "policies/routing.contract:"]),
    ((("x-model", "support-chatbot"),), grpc.StatusCode.UNAVAILABLE, ["none has an endpoint", "`routing.pinned-model`"]),
    ((("x-model", PRIMARY), ("x-slo-latency", "150ms")), grpc.StatusCode.PERMISSION_DENIED, ["`routing.latency-target`"]),
])
def test_every_rejection_and_bad_header_has_its_status_and_reason(client: OipClient, metadata: tuple[tuple[str, str], ...],
                                                                   code: grpc.StatusCode, words: list[str]) -> None:
    e = refused(client, metadata)
    assert e.code() == code, e.details()
    for w in words:
        assert w in e.details(), e.details()
    t = trailers(e)
    assert t["x-policyc-reason"]
    if code is grpc.StatusCode.PERMISSION_DENIED:
        assert t["x-policyc-rule"] and t["x-policyc-decision-id"]  # a rejection is a decision: audited by id


def test_http_clients_get_the_http_status(gateway: Gateway) -> None:
    req = urllib.request.Request(f"http://{gateway.listen}/v2/models/{PRIMARY}/infer", data=b"{}",
                                 headers={"X-Data-Regoin": "us-west", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)  # noqa: S310 - loopback
    assert info.value.code == 400
    assert "did you mean `X-Data-Region`" in info.value.read().decode()
    req = urllib.request.Request(f"http://{gateway.listen}/v2/models/{PRIMARY}/infer", data=b"{}",
                                 headers={"X-Tenant": "st-marys", "X-Model": PRIMARY, "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=10)  # noqa: S310
    assert info.value.code == 403 and "compliance.healthcare-eu" in info.value.headers["x-policyc-rule"]


def test_a_client_cannot_steer_envoy_past_the_picker(gateway: Gateway, client: OipClient) -> None:
    """More retries, its own timeouts or retry headers from the client are dropped: a lite
    request (no budget, no fallback) that tries them is answered once, by a picked host."""
    md = ((("x-model", BACKUP),) + BASE[1:] + (("x-envoy-max-retries", "5"), ("x-envoy-retry-on", "5xx,reset"),
          ("x-envoy-upstream-rq-per-try-timeout-ms", "1"), ("x-policyc-retry-headers", "x-retry-count=7")))
    a = client.infer(PRIMARY, IDS, metadata=md, timeout=10)
    assert a.headers["x-envoy-attempt-count"] == "1" and a.retry_count == 0 and a.variant == "full"
    assert a.instance == gateway.picker.picker.recent[a.decision_id].instance_id


def test_a_bundle_reload_under_gateway_load_fails_no_request(gateway: Gateway, bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "bundle.json"
    bundle_io.write(bundle, path)
    failures: list[str] = []
    done = threading.Event()
    count = [0]

    def load() -> None:
        with OipClient(gateway.listen) as c:
            while not done.is_set():
                try:
                    c.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
                    count[0] += 1
                except grpc.RpcError as e:
                    failures.append(f"{e.code()}: {e.details()}")
                time.sleep(0.02)  # paced: within the two simulated GPUs' share per placer tick

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    hashes = []
    with operator_channel(f"127.0.0.1:{gateway.server.port}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        for _ in range(3):
            time.sleep(0.15)
            hashes.append(stub.ReloadBundle(pb.ReloadBundleRequest(path=str(path)), timeout=30).bundle_hash)
    time.sleep(0.15)
    done.set()
    for t in threads:
        t.join()
    assert not failures, failures[:3]
    assert count[0] > 10 and hashes == [bundle.content_hash] * 3


def test_shedding_answers_429_beyond_the_in_flight_limit(gateway: Gateway, client: OipClient) -> None:
    picker = gateway.picker.picker
    config = picker.config
    deadline = time.monotonic() + 5
    while picker.in_flight and time.monotonic() < deadline:  # earlier requests end with their access-log entry
        time.sleep(0.01)
    picker.config = type(config)(host=config.host, port=config.port, max_in_flight=1)
    try:
        first = client.infer_future(PRIMARY, IDS, metadata=BASE + (STALL,), timeout=10)
        deadline = time.monotonic() + 5
        while picker.in_flight < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        e = refused(client, BASE)
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "shedding" in e.details()
        assert answer_of(first).variant == "simplified"
    finally:
        picker.config = config


def _cancelled(gateway: Gateway, instance_id: str) -> float:
    """`policyc_modelserver_cancelled_total` of one instance (its process's /metrics)."""
    http = gateway.models.instance(instance_id).http_endpoint
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:  # noqa: S310 - loopback
        for line in r.read().decode().splitlines():
            if line.startswith("policyc_modelserver_cancelled_total") and f'instance="{instance_id}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_stalled_request_is_reset_at_its_budget_alone_and_answered_by_the_backup(gateway: Gateway, client: OipClient) -> None:
    client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)  # connections up, to a primary and to the backup
    client.infer(PRIMARY, IDS, metadata=(("x-model", BACKUP),) + BASE[1:], timeout=10)
    envoy = gateway.envoy
    before, hosts_before = envoy.stats(f"cluster.{POOL_CLUSTER}."), envoy.host_stats(POOL_CLUSTER)
    futures = [client.infer_future(PRIMARY, IDS, metadata=BASE + ((STALL,) if i == 0 else ()), timeout=10) for i in range(4)]
    answers = [answer_of(f) for f in futures]
    after, hosts_after = envoy.stats(f"cluster.{POOL_CLUSTER}."), envoy.host_stats(POOL_CLUSTER)
    stalled, siblings = answers[0], answers[1:]
    pick = gateway.picker.picker.recent[stalled.decision_id]
    # the stalled one: reset at its per-try timeout, retried once on the backup, which saw X-Retry-Count: 1
    assert stalled.instance.startswith(BACKUP) and stalled.variant == "simplified" and stalled.retry_count == 1
    assert stalled.headers["x-envoy-attempt-count"] == "2"
    assert after[f"cluster.{POOL_CLUSTER}.upstream_rq_per_try_timeout"] - before[f"cluster.{POOL_CLUSTER}.upstream_rq_per_try_timeout"] == 1
    assert after[f"cluster.{POOL_CLUSTER}.upstream_rq_retry"] - before[f"cluster.{POOL_CLUSTER}.upstream_rq_retry"] == 1
    # the three siblings answered in full, on their first attempt, by primaries
    for a in siblings:
        assert a.instance.startswith(PRIMARY) and a.variant == "full" and a.headers["x-envoy-attempt-count"] == "1"
    # one HTTP/2 connection per model server, before and after: the reset broke a stream, not a connection
    assert after[f"cluster.{POOL_CLUSTER}.upstream_cx_total"] == before[f"cluster.{POOL_CLUSTER}.upstream_cx_total"]
    assert after.get(f"cluster.{POOL_CLUSTER}.upstream_cx_destroy_with_active_rq", 0) == 0
    primary_host = hosts_after[pick.endpoint]
    assert primary_host["cx_total"] == hosts_before[pick.endpoint]["cx_total"] == 1
    assert primary_host["cx_active"] == 1
    siblings_on_it = [a for a in siblings if a.instance == pick.instance_id]
    assert primary_host["rq_total"] - hosts_before[pick.endpoint]["rq_total"] == 1 + len(siblings_on_it)
    assert _cancelled(gateway, pick.instance_id) >= 1  # the model server saw its stream reset
    # every act with the decision id, and the anomaly on the chosen GPU
    acts = gateway.picker.acts.of(stalled.decision_id, 3, timeout=5)  # learnt from Envoy's access log
    assert [r.kind for r in acts] == ["cancel_stream", "redirect", "report_anomaly"]
    assert "seen in Envoy's access log" in acts[0].detail and "simplified variant" in acts[1].detail
    assert acts[2].target == pick.gpu_key and "x-retry-count: 1" in acts[1].detail
    assert f"{pick.per_try_timeout_ms} ms" in acts[0].detail
    # ... and in the audit log itself: the decision and its three acts, joined by the decision id
    from policyc.audit.query import AuditReader

    deadline, stored, decision = time.monotonic() + 5, [], None
    while time.monotonic() < deadline and (len(stored) < 3 or decision is None):
        with AuditReader.open(gateway.workdir / "audit.db") as reader:
            decision, stored = reader.decision(stalled.decision_id), reader.actions_for(stalled.decision_id)
        time.sleep(0.05)
    assert decision is not None and decision.record.placement.instance == pick.instance_id  # type: ignore[union-attr]
    assert [e.record.kind for e in stored] == ["cancel_stream", "redirect", "report_anomaly"]
    assert stored[0].record.rule == pick.breaker.name and stored[0].record.rule_origin is not None  # type: ignore[union-attr]


def test_the_anomaly_lowers_the_chosen_gpus_health_on_the_next_tick(gateway: Gateway, client: OipClient) -> None:
    refresher = gateway.server.refresher  # running: a tick every 200 ms
    a = client.infer(PRIMARY, IDS, metadata=BASE + (STALL,), timeout=10)
    assert a.variant == "simplified"
    pick = gateway.picker.picker.recent[a.decision_id]
    assert len(gateway.picker.acts.of(a.decision_id, 3, timeout=5)) == 3  # reported once the access log told
    reported = time.monotonic()  # the refresher's clock: a telemetry sample taken after this folds the report in
    snap = refresher.current()
    i = snap.topology.gpu_index[tuple(pick.gpu_key.split("/"))]  # type: ignore[index]
    before = float(snap.gpu_health[i])
    deadline = time.monotonic() + 5
    while refresher.current().taken_at <= reported and time.monotonic() < deadline:
        time.sleep(0.02)
    assert float(refresher.current().gpu_health[i]) < before


def _placed(client: OipClient, metadata: tuple[tuple[str, str], ...] = BASE + (STALL,), tries: int = 20):  # type: ignore[no-untyped-def]
    """A request (by default one held 5 s by its primary: broken at its budget, answered by
    the backup). The breaks earlier in the module each cost the chosen GPU 0.3 of health,
    regained at 0.1 a second: if both primaries are ruled out for the moment, try again."""
    for i in range(tries):
        try:
            return client.infer(PRIMARY, IDS, metadata=metadata, timeout=10)
        except grpc.RpcError as e:
            if e.code() is not grpc.StatusCode.UNAVAILABLE or i == tries - 1:  # type: ignore[attr-defined]
                raise
            time.sleep(0.25)
    raise AssertionError("unreachable")


def test_each_call_is_one_ext_proc_exchange_and_breaks_come_from_the_access_log(gateway: Gateway, client: OipClient) -> None:
    """Requests with a budget (they can break) cost Envoy one message to the picker and one
    back, the stream closed by the picker; the break is learnt from the access log within
    a flush interval or so (Envoy flushes every 50 ms)."""
    prefix = "http.policyc_gateway.ext_proc."
    _placed(client, BASE)  # the earlier tests' breaks may rule both primaries out for a moment
    before = gateway.envoy.stats(prefix)
    for _ in range(5):
        a = client.infer(PRIMARY, IDS, metadata=BASE, timeout=10)
        assert gateway.picker.picker.recent[a.decision_id].per_try_timeout_ms is not None
    after = gateway.envoy.stats(prefix)
    delta = {k.removeprefix(prefix): after[k] - before.get(k, 0) for k in after}
    assert delta["streams_started"] == delta["stream_msgs_sent"] == delta["stream_msgs_received"] == 5, delta
    assert delta.get("streams_failed", 0) == 0 and delta.get("message_timeouts", 0) == 0
    a = _placed(client)
    answered = time.monotonic()
    acts = gateway.picker.acts.of(a.decision_id, 3, timeout=30)
    seen = time.monotonic() - answered
    b = next(b for b in gateway.picker.acts.breaks if b.decision_id == a.decision_id)
    assert [r.kind for r in acts] == ["cancel_stream", "redirect", "report_anomaly"] and b.at_budget and b.attempt == 2
    # tens of ms on a quiet machine (one 50 ms flush); the bound is what a loaded 2-core machine keeps: the claim
    # is that the access log brings the break (b.lag_s is measured from it), not a figure of this machine's load
    assert b.lag_s is not None and b.lag_s < 5.0 and seen < 5.0, (b.lag_s, seen)
    print(f"\nbreak -> act recorded {b.lag_s * 1e3:.0f} ms (answer at the client -> act {seen * 1e3:.0f} ms)")
    deadline = time.monotonic() + 5
    while gateway.picker.picker.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gateway.picker.picker.in_flight == 0  # every request ended with its access-log entry


def test_an_envoy_without_policycs_access_log_breaks_are_learnt_in_the_response_phase(gateway: Gateway) -> None:
    """A user's own Envoy with no access log to policyc (`policyc gateway --print-bootstrap`):
    a picker not following one keeps the response phase for requests that can break."""
    from policyc.gateway.picker import PickerConfig
    from policyc.gateway.server import PickerServer

    picker = PickerServer(gateway.server, PickerConfig())
    port = gateway.thread.call(picker.start())
    spec = GatewaySpec(picker=f"127.0.0.1:{port}", listen=f"127.0.0.1:{free_port()}", admin=f"127.0.0.1:{free_port()}",
                       endpoints=tuple(i.endpoint for i in gateway.models.instances))
    try:
        with EnvoyProcess(build_bootstrap(spec), gateway.workdir / "envoy-response-phase") as envoy, \
                OipClient(spec.listen) as c:
            a = _placed(c)
            # recorded before the answer left Envoy: no waiting
            acts = [r for r in picker.acts.records if r.decision_id == a.decision_id]
            assert [r.kind for r in acts] == ["cancel_stream", "redirect", "report_anomaly"]
            assert "seen in the answer's headers" in acts[0].detail
            st = envoy.stats("http.policyc_gateway.ext_proc.")
            # the admitted request: its request headers and its response headers (a refused try: one message)
            assert st["http.policyc_gateway.ext_proc.stream_msgs_sent"] - st["http.policyc_gateway.ext_proc.streams_started"] == 1
        assert picker.picker.in_flight == 0
    finally:
        gateway.thread.call(picker.stop(grace=0.1))


def test_a_pick_whose_log_entry_never_comes_stops_counting_as_in_flight(gateway: Gateway, client: OipClient) -> None:
    """Should Envoy's entry for a request never come (the log lost it), the pick stops counting
    toward the 429 limit and the drain after `OPEN_MAX_S`, counted as `unlogged`."""
    from policyc.gateway.picker import OPEN_MAX_S

    picker = gateway.picker.picker
    deadline = time.monotonic() + 5
    while picker.in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    pick = next(iter(picker.recent.values()))
    before = picker.counts.get("unlogged", 0)
    gateway.thread.call(_open_at(picker, "f" * 32, pick, time.perf_counter() - OPEN_MAX_S - 1))
    _placed(client, BASE)
    assert "f" * 32 not in picker._open and picker.counts["unlogged"] == before + 1


async def _open_at(picker, did: str, pick, since: float) -> None:  # type: ignore[no-untyped-def]
    picker._open[did] = (pick, since)  # on the loop, as the picker does


def test_policyc_gateway_without_accounting_logs_only_what_the_picker_needs(gateway: Gateway) -> None:
    """`policyc gateway`'s runner with accounting off: its access log carries the calls that
    can break (and the attempts Envoy broke) only; a break is still learnt from it."""
    from policyc.gateway.runner import Gateway as Runner
    from policyc.gateway.runner import GatewayOptions

    runner = Runner(gateway.thread, GatewayOptions(listen=f"127.0.0.1:{free_port()}", admin=f"127.0.0.1:{free_port()}",
                                                   accounting=False, forwarded_headers=frozenset({STALL[0]}),
                                                   workdir=gateway.workdir / "runner-no-accounting"))
    with runner:
        assert runner.access_log is not None and not runner.access_log.receiver.records
        receiver, picker = runner.access_log.receiver, runner.picker
        with OipClient(runner.options.listen) as c:
            lite = c.infer(PRIMARY, IDS, metadata=(("x-model", BACKUP),) + BASE[1:], timeout=10)  # no budget: not logged
            plain = _placed(c, BASE)  # a budget, answered at once: logged, no break
            a = _placed(c)
        acts = picker.acts.of(a.decision_id, 3, timeout=5)
        assert [r.kind for r in acts] == ["cancel_stream", "redirect", "report_anomaly"]
        assert picker.picker.recent[lite.decision_id].per_try_timeout_ms is None
        assert not picker.acts.of(plain.decision_id) and picker.picker.counts["broken"] == 1
        deadline = time.monotonic() + 5
        while receiver.counts.calls < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        # the two calls with a budget, and the stalled call's broken attempt (its answer is not logged)
        assert receiver.counts.calls == 2 and receiver.counts.entries == 3 and receiver.counts.incomplete == 0, receiver.counts
        assert picker.picker.in_flight == 0


def test_no_instance_with_an_endpoint_is_503_and_the_picker_not_ready(gateway: Gateway, client: OipClient) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with operator_channel(f"127.0.0.1:{gateway.server.port}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        for s in gateway.slots:
            stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=s.instance_id), timeout=10)
    e = refused(client, BASE)
    assert e.code() == grpc.StatusCode.UNAVAILABLE and "no instance with an endpoint is registered" in e.details()
    with grpc.insecure_channel(f"127.0.0.1:{gateway.picker.port}") as ch:
        health = health_pb2_grpc.HealthStub(ch)
        deadline = time.monotonic() + 5
        status = None
        while time.monotonic() < deadline:
            status = health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=5).status
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            time.sleep(0.05)
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        live = health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5).status
        assert live == health_pb2.HealthCheckResponse.SERVING


def test_a_dead_picker_makes_envoy_answer_as_its_failure_mode_says(gateway: Gateway, client: OipClient) -> None:
    allow_spec = GatewaySpec(picker=f"127.0.0.1:{gateway.picker.port}", listen=f"127.0.0.1:{free_port()}",
                             admin=f"127.0.0.1:{free_port()}", endpoints=tuple(i.endpoint for i in gateway.models.instances),
                             failure_mode_allow=True)
    with EnvoyProcess(build_bootstrap(allow_spec), gateway.workdir / "envoy-allow") as allow:
        gateway.thread.call(gateway.picker.stop(grace=0.1))
        # failure_mode_allow: false (the default): the request is refused, never sent unpicked
        e = refused(client, BASE)
        assert e.code() == grpc.StatusCode.UNAVAILABLE, (e.code(), e.details())
        # failure_mode_allow: true: Envoy's own round-robin over the pool answers
        listen = allow_spec.listen
        with OipClient(listen) as c:
            served = {c.infer(PRIMARY, IDS, metadata=BASE, timeout=10).instance for _ in range(6)}
        assert len(served) >= 2 and all(s in {x.instance_id for x in gateway.models.instances} for s in served)
        assert allow.stats("http.policyc_gateway.ext_proc.").get("http.policyc_gateway.ext_proc.failure_mode_allowed", 0) >= 1
