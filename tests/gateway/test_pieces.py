"""The gateway's pure parts: endpoints, the bootstrap (checked by the real Envoy), which
headers are the policy's, and how refusals map to HTTP and gRPC statuses."""

from __future__ import annotations

import json
import time
import subprocess
from pathlib import Path

import pytest

from policyc.gateway.bootstrap import ALS_BUFFER_BYTES, PICKER_CLUSTER, POOL_CLUSTER, GatewaySpec, build_bootstrap, eds_document
from policyc.gateway.envoy_process import envoy_binary
from policyc.gateway.refusal import from_error
from policyc.gateway.request_view import header_map, policy_headers, shape_key
from policyc.matcher.instance import Deployment, canonical_endpoint
from policyc.server import convert
from policyc.server.errors import ServiceError, Status
from policyc.server.proto import pb


@pytest.mark.parametrize("text, canonical", [
    ("127.0.0.1:8001", "127.0.0.1:8001"), ("[::1]:8001", "[::1]:8001"), ("[0:0::1]:08001", "[::1]:8001"),
])
def test_endpoints_are_canonical_ip_port(text: str, canonical: str) -> None:
    assert canonical_endpoint(text) == canonical


@pytest.mark.parametrize("text, words", [
    ("localhost:8001", "not an IP address"), ("127.0.0.1", "not `ip:port`"), ("127.0.0.1:0", "1..65535"),
    ("0.0.0.0:8001", "cannot receive traffic"), ("", "is empty"),
])
def test_a_bad_endpoint_is_refused_naming_the_field(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        canonical_endpoint(text)
    if text:
        msg = pb.RegisterInstanceRequest(id="i", model="m", deployment=pb.Deployment(
            host="h", gpu="g", gpu_model="H100", region="us-west", endpoint=text))
        with pytest.raises(ServiceError) as e:
            convert.instance(msg, "m")
        assert e.value.field == "deployment.endpoint" and words in e.value.message
        with pytest.raises(ValueError, match="endpoint"):
            Deployment(host="h", gpu="g", gpu_model="H100", region="us-west", endpoint=text)


def _validate(boot: dict, tmp_path: Path) -> None:  # type: ignore[type-arg]
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(boot))
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]


@pytest.mark.parametrize("spec", [
    GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001", "[::1]:8002"), retry_budget=0.2,
                access_log_cluster="127.0.0.1:9003"),
    GatewaySpec(picker="127.0.0.1:9002", eds_path="/nonexistent/pool.json", failure_mode_allow=True),
    GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",), use_picker=False),
    GatewaySpec(picker="unix:/run/policyc/picker.sock", endpoints=("127.0.0.1:8001",)),
    GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:8001",), access_log_cluster="127.0.0.1:9003",
                breaks_from_access_log=True, access_log_flush_ms=80, log_every_attempt=False),
], ids=["static pool, retry budget, user's ALS", "EDS file, failure mode allow", "round-robin baseline",
        "picker on a Unix socket", "breaks from policyc's access log"])
def test_every_bootstrap_shape_is_one_envoy_accepts(spec: GatewaySpec, tmp_path: Path) -> None:
    if spec.eds_path is not None:
        pool = tmp_path / "pool.json"
        pool.write_text(json.dumps(eds_document(["127.0.0.1:8001"], "1")))
        spec = GatewaySpec(picker=spec.picker, eds_path=str(pool), failure_mode_allow=True)
    boot = build_bootstrap(spec)
    _validate(boot, tmp_path)
    names = [f["name"] for f in boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
             ["typed_config"]["http_filters"]]
    assert names == (["envoy.filters.http.ext_proc", "envoy.filters.http.router"] if spec.use_picker
                     else ["envoy.filters.http.router"])
    pool_cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == POOL_CLUSTER)
    lb = pool_cluster["load_balancing_policy"]["policies"][0]["typed_extension_config"]["name"]
    assert lb == ("envoy.load_balancing_policies.override_host" if spec.use_picker else "envoy.load_balancing_policies.round_robin")
    if spec.use_picker:  # the response phase: asked about only when the picker cannot learn breaks from the access log
        ext_proc = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"][0]
        mode = ext_proc["typed_config"]["processing_mode"]["response_header_mode"]
        assert mode == ("SKIP" if spec.breaks_from_access_log else "SEND")
    if spec.access_log_cluster is not None:
        hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        common = hcm["access_log"][0]["typed_config"]["common_config"]
        assert common["buffer_flush_interval"] == f"{spec.access_log_flush_ms / 1000:g}s"
        assert common["buffer_size_bytes"] == ALS_BUFFER_BYTES  # the interval, not Envoy's 16 KiB default, decides
    if spec.picker.startswith("unix:"):  # Envoy reaches the picker over its Unix socket (a `pipe` address)
        picker = next(c for c in boot["static_resources"]["clusters"] if c["name"] == PICKER_CLUSTER)
        assert picker["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == \
            {"pipe": {"path": "/run/policyc/picker.sock"}}


@pytest.mark.parametrize("spec, words", [
    (GatewaySpec(picker="127.0.0.1:9002"), "needs its pool"),
    (GatewaySpec(picker="127.0.0.1:9002", endpoints=("host:1",)), "not an IP address"),
    (GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:1",), retry_budget=2.0), "share in [0, 1]"),
    (GatewaySpec(picker="unix:picker.sock", endpoints=("127.0.0.1:1",)), "must be an absolute path"),
    (GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:1",), breaks_from_access_log=True), "give access_log_cluster"),
    (GatewaySpec(picker="127.0.0.1:9002", endpoints=("127.0.0.1:1",), access_log_flush_ms=0), "access_log_flush_ms must be"),
])
def test_a_bootstrap_that_cannot_work_is_refused(spec: GatewaySpec, words: str) -> None:
    with pytest.raises(ValueError) as e:
        build_bootstrap(spec)
    assert words in str(e.value)


def test_only_the_policys_headers_reach_the_parser_and_the_shape_key() -> None:
    h = header_map([(":path", "/x"), ("x-request-id", "1"), ("user-agent", "u"), ("x-envoy-expected-rq-timeout-ms", "5"),
                    ("x-policyc-stall-ms", "100"), ("X-Tenant", "acme-bank"), ("x-data-regoin", "us-west"), ("te", "trailers"),
                    ("x-retry-count", "1"), ("x-app-trace", "t")])
    assert policy_headers(h, frozenset({"x-app-trace"})) == {"x-tenant": "acme-bank", "x-data-regoin": "us-west",
                                                              "x-retry-count": "1"}
    other = dict(h, **{"x-request-id": "2"})
    assert shape_key(policy_headers(h)) == shape_key(policy_headers(other))  # a per-request id is not a new shape
    assert header_map([("a", "1"), ("A", "2")]) == {"a": "1,2"}  # repeated: joined, so the parser can refuse it


@pytest.mark.parametrize("status, http, grpc_code", [
    (Status.INVALID_ARGUMENT, 400, 3), (Status.NOT_FOUND, 400, 3), (Status.UNAVAILABLE, 503, 14),
    (Status.RESOURCE_EXHAUSTED, 429, 8), (Status.PERMISSION_DENIED, 403, 7),
])
def test_service_errors_map_to_http_and_grpc(status: Status, http: int, grpc_code: int) -> None:
    r = from_error(ServiceError(status, "why", ("one", "two")))
    assert (r.http_status, r.grpc_status, r.reason, r.problems) == (http, grpc_code, "why", ("one", "two"))


def test_the_pre_serialized_forward_is_the_same_message() -> None:
    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from policyc.gateway.messages import forward, forward_bytes
    from policyc.gateway.pick import Pick
    from policyc.gateway.pool import Member

    backup = Member("lite@h/g2", "fraud-scorer-lite", "127.0.0.1:8003", "h/g2", 0.5)
    for fallbacks, timeout in (((backup,), 43), ((), None)):
        for did in ("a" * 32, "b" * 32):  # the second reuses the cached head
            pick = Pick(did, "fraud-scorer", "fs@h/g0", "127.0.0.1:8001", "h/g0", fallbacks, timeout, None, None,
                        (("x-retry-count", "1"),) if fallbacks else (), 14.0, 0)
            for see, watch in ((timeout is not None, False), (False, timeout is not None)):  # response phase / access log
                got = ep.ProcessingResponse.FromString(forward_bytes(pick, see, watch))
                want = forward(pick, see_answer=see, watch=watch)
                assert got.HasField("mode_override") is not see  # the bootstrap's SEND, or SKIP for this request
                assert ("policyc.gateway" in got.dynamic_metadata.fields) == watch
                def headers(m: ep.ProcessingResponse) -> dict[str, bytes]:
                    return {h.header.key: h.header.raw_value for h in m.request_headers.response.header_mutation.set_headers}
                assert headers(got) == headers(want) and headers(got)["x-policyc-decision-id"] == did.encode()
                got.request_headers.response.header_mutation.ClearField("set_headers")
                want.request_headers.response.header_mutation.ClearField("set_headers")
                assert got == want  # metadata, removed headers, mode override


def test_the_pickers_memoized_header_view_reads_what_the_parser_would() -> None:
    """`PolicyView.of` on Envoy's header messages equals `policy_headers(header_map(...))`:
    names lower-cased, repeats joined, Envoy's/transport/forwarded headers skipped; its memo
    of names stays bounded whatever names clients send."""
    from envoy.config.core.v3 import base_pb2

    from policyc.gateway.request_view import PolicyView

    pairs = [(":path", "/x"), ("x-request-id", "1"), ("X-Tenant", "acme-bank"), ("x-envoy-attempt-count", "1"),
             ("x-data-region", "us-west"), ("x-app-trace", "t"), ("X-Data-Region", "eu"), ("grpc-timeout", "1S"),
             ("x-slo-latency", "écrit")]
    hs = base_pb2.HeaderMap()
    for i, (k, v) in enumerate(pairs):  # Envoy sends raw_value; an older one `value`
        hs.headers.add(key=k, raw_value=v.encode()) if i % 2 == 0 else hs.headers.add(key=k, value=v)
    view = PolicyView(frozenset({"x-app-trace"}))
    for _ in range(2):  # the second time from the memo
        assert view.of(hs.headers) == policy_headers(header_map(pairs), frozenset({"x-app-trace"})) == {
            "x-tenant": "acme-bank", "x-data-region": "us-west,eu", "x-slo-latency": "écrit"}
    many = base_pb2.HeaderMap()
    for i in range(PolicyView.LIMIT + 10):
        many.headers.add(key=f"x-junk-{i}", raw_value=b"1")
    assert len(view.of(many.headers)) == PolicyView.LIMIT + 10 and len(view._names) <= PolicyView.LIMIT


def test_a_picks_route_is_shared_until_the_pool_changes() -> None:
    """`plan_pick` works out the fallbacks and the retry's headers once per instance, rule
    and pool version: a pool change (here: what Envoy holds) gives the next pick a new route."""
    from types import SimpleNamespace

    from policyc.gateway.pick import _route
    from policyc.gateway.pool import Member

    backup = Member("lite@h/g2", "fraud-scorer-lite", "127.0.0.1:8003", "h/g2", 0.5)
    other = Member("lite@h/g3", "fraud-scorer-lite", "127.0.0.1:8004", "h/g3", 0.4)

    class FakePool:  # the two members the route reads; `version` as the real pool bumps it
        def __init__(self) -> None:
            self.published: frozenset[str] | None = None
            self.v = 0

        def version(self) -> int:
            return self.v

        def fallbacks(self, model: str, avoid_endpoint: str, avoid_gpu: str) -> tuple[Member, ...]:
            return tuple(m for m in (backup, other) if self.published is None or m.endpoint in self.published)[:1]

    from policyc.compiler.bundle import Redirect

    breaker = SimpleNamespace(actions=(Redirect(backup="fraud-scorer-lite", headers=(("X-Retry-Reason", "budget"),)),))
    pool = FakePool()
    first = _route(breaker, 0, "127.0.0.1:8001", "h/g0", pool)  # type: ignore[arg-type]
    assert _route(breaker, 0, "127.0.0.1:8001", "h/g0", pool) is first  # type: ignore[arg-type]
    assert first.endpoints == "127.0.0.1:8001,127.0.0.1:8003"
    assert first.retry_headers == (("x-retry-count", "1"), ("x-retry-reason", "budget"))
    pool.published, pool.v = frozenset({"127.0.0.1:8001", "127.0.0.1:8004"}), 1
    assert _route(breaker, 0, "127.0.0.1:8001", "h/g0", pool).endpoints == "127.0.0.1:8001,127.0.0.1:8004"  # type: ignore[arg-type]
    # a retry is never redirected again
    assert _route(breaker, 1, "127.0.0.1:8001", "h/g0", pool).fallbacks == ()  # type: ignore[arg-type]


def test_what_the_access_log_says_becomes_a_break_or_not(bundle) -> None:  # type: ignore[no-untyped-def]
    """The picker's reading of one call's entry (`EndpointPicker._logged`), as Envoy writes
    them: a per-try timeout retried on the backup, the same with only the broken attempt
    logged, a reset before the budget, and a call answered by its primary on the first try."""
    from types import SimpleNamespace

    from policyc.gateway.access_log import Attempt, Call
    from policyc.gateway.acts import Acts
    from policyc.gateway.pick import Pick
    from policyc.gateway.picker import EndpointPicker
    from policyc.gateway.pool import Member

    breaker = next(b for b in bundle.breakers if any(a.kind == "redirect" for a in b.actions))
    backup = Member("lite@h/g2", "fraud-scorer-lite", "127.0.0.1:8003", "h/g2", 0.5)
    now = time.time()

    def reading(attempts: list[Attempt], n: int, upstream: str = "127.0.0.1:8003") -> tuple[list[str], object]:
        acts = Acts(None, None, bundle)
        pick = Pick("d" * 32, "fraud-scorer", "fs@h/g0", "127.0.0.1:8001", "h/g0", (backup,), 40, breaker, None,
                    (("x-retry-count", "1"),), 13.0, 0)
        picker = SimpleNamespace(_open={pick.decision_id: (pick, 0.0)}, acts=acts, counts={}, _count=lambda what: None, in_flight_gpus=None)
        call = Call(pick.decision_id, now - 0.1, 300, 200, 0.08, 0.079, n, "0", False, variant="simplified",
                    upstream_host=upstream, instance="lite@h/g2")
        EndpointPicker._logged(picker, call, attempts)  # type: ignore[arg-type]
        assert pick.decision_id not in picker._open  # the request has ended
        return [r.kind for r in acts.records], (acts.breaks[0] if acts.breaks else None)

    timed_out = Attempt("127.0.0.1:8001", None, 400, 0, 0.041, None, 0, None, None, "upstream_request_timeout")
    answered = Attempt("127.0.0.1:8003", "lite@h/g2", 400, 300, 0.005, 0.004, 200, "0", 0.0002, "")
    kinds, b = reading([timed_out, answered], 2)
    assert kinds == ["cancel_stream", "redirect", "report_anomaly"]
    assert b.at_budget and b.served == "127.0.0.1:8003" and b.answered_by == "lite@h/g2" and b.attempt == 2  # type: ignore[attr-defined]
    assert 0.0 <= b.lag_s < 5.0  # type: ignore[attr-defined]  # from the break to its reading: ~20 ms, more under load
    kinds, b = reading([timed_out], 2)  # the log kept for the picker alone: the answering attempt is not in it
    assert kinds == ["cancel_stream", "redirect", "report_anomaly"] and b.served == "127.0.0.1:8003" and b.at_budget  # type: ignore[attr-defined]
    reset = Attempt("127.0.0.1:8001", None, 400, 0, 0.003, None, 0, None, None, "upstream_remote_reset")
    kinds, b = reading([reset, answered], 2)
    assert kinds[0] == "cancel_stream" and not b.at_budget  # type: ignore[attr-defined]
    primary = Attempt("127.0.0.1:8001", "fs@h/g0", 400, 300, 0.005, 0.004, 200, "0", 0.0002, "")
    assert reading([primary], 1, "127.0.0.1:8001") == ([], None)  # answered on the first try: no break
