"""The Endpoint Picker Protocol's candidate subset and fallback list through a real Envoy:
a Lua filter before the picker puts the subset the test names (a request header here, where
a Gateway API implementation would put its own) into `envoy.lb.subset_hint` as a list, the
bootstrap forwards that namespace to the picker, and the picker's answer steers Envoy.

- a subset restricts the pick (the answer comes from the subset's instance);
- a subset with no admissible instance is a 503 (gRPC UNAVAILABLE) naming the subset;
- the fallback list (`x-gateway-destination-endpoint`: primary,fallback) reaches Envoy and a
  primary that refuses connections is retried on the fallback."""

from __future__ import annotations

import copy
from typing import Any, Iterator

import grpc
import pytest

from policyc.gateway.bootstrap import SUBSET_KEY, SUBSET_NAMESPACE, GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.modelserver.client import OipClient, token_ids
from policyc.server.fleet import admissible_fleet

from gateway_rig import BACKUP, PRIMARY, Gateway, free_port

IDS = token_ids(32)
BASE = (("x-model", PRIMARY), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"))
SUBSET_HEADER = "x-test-subset"  # this test's own: the Lua filter below turns it into the subset list

SUBSET_LUA = f"""
function envoy_on_request(handle)
  local wanted = handle:headers():get("{SUBSET_HEADER}")
  if wanted == nil then return end
  handle:headers():remove("{SUBSET_HEADER}")
  local subset = {{}}
  for e in string.gmatch(wanted, "[^,]+") do subset[#subset + 1] = e end
  handle:streamInfo():dynamicMetadata():set("{SUBSET_NAMESPACE}", "{SUBSET_KEY}", subset)
end
"""


def _with_subset_filter(bootstrap: dict[str, Any]) -> dict[str, Any]:
    b = copy.deepcopy(bootstrap)
    hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"].insert(0, {"name": "test.subset", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"inline_string": SUBSET_LUA}}})
    return b


@pytest.fixture(scope="module")
def rig(gateway: Gateway) -> Iterator[tuple[Gateway, OipClient, str]]:
    """The module's gateway plus a second Envoy in front of the same picker and servers, with
    the subset filter, and one more primary instance whose endpoint refuses connections."""
    server = gateway.server
    assert server.cluster is not None
    used = {(s.instance.deployment.host, s.instance.deployment.gpu) for s in gateway.slots}
    spare = next(i for i in admissible_fleet(gateway.bundle, server.cluster.gpu_slots(), models=[PRIMARY])
                 if (i.deployment.host, i.deployment.gpu) not in used)
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    server.engine.register_many([spare.model_copy(update={
        "id": spare.id + "#dead", "deployment": spare.deployment.model_copy(update={"endpoint": dead})})])
    assert gateway.als is not None
    spec = GatewaySpec(picker=f"127.0.0.1:{gateway.picker.port}", listen=f"127.0.0.1:{free_port()}",
                       admin=f"127.0.0.1:{free_port()}",
                       endpoints=(*(i.endpoint for i in gateway.models.instances), dead),
                       access_log_cluster=f"127.0.0.1:{gateway.als.port}", breaks_from_access_log=True, log_every_call=False)
    envoy = EnvoyProcess(_with_subset_filter(build_bootstrap(spec)), gateway.workdir / "envoy-subset").start()
    try:
        with OipClient(spec.listen) as c:
            yield gateway, c, dead
    finally:
        envoy.stop()
        server.engine.deregister(spare.id + "#dead")


def _primaries(gw: Gateway) -> list[str]:
    return [s.instance_id for s in gw.slots if s.model == PRIMARY]


def test_a_subset_restricts_the_pick(rig: tuple[Gateway, OipClient, str]) -> None:
    gw, client, _ = rig
    for iid in _primaries(gw):
        for _ in range(3):
            a = client.infer(PRIMARY, IDS, metadata=BASE + ((SUBSET_HEADER, gw.endpoint_of(iid)),), timeout=15)
            assert a.instance == iid  # the only admissible instance in the subset answered
            pick = gw.picker.picker.recent[a.decision_id]
            assert pick.instance_id == iid and pick.endpoints.split(",")[0] == gw.endpoint_of(iid)


def test_a_subset_with_no_admissible_instance_is_refused_503_with_the_reason(rig: tuple[Gateway, OipClient, str]) -> None:
    gw, client, _ = rig
    backup = next(s.instance_id for s in gw.slots if s.model == BACKUP)
    for subset in ("10.9.9.9:8000", gw.endpoint_of(backup)):  # nothing there; only the other model's instance
        with pytest.raises(grpc.RpcError) as info:
            client.infer(PRIMARY, IDS, metadata=BASE + ((SUBSET_HEADER, subset),), timeout=15)
        e: Any = info.value
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e.details()
        assert "candidate subset" in e.details() and subset in e.details(), e.details()


def test_the_fallback_list_reaches_envoy_and_a_failed_primary_goes_to_the_fallback(rig: tuple[Gateway, OipClient, str]) -> None:
    gw, client, dead = rig
    backup = next(s.instance_id for s in gw.slots if s.model == BACKUP)
    subset = f"{dead},{gw.endpoint_of(backup)}"
    a = client.infer(PRIMARY, IDS, metadata=BASE + ((SUBSET_HEADER, subset),), timeout=15)
    pick = gw.picker.picker.recent[a.decision_id]
    assert pick.endpoint == dead  # the subset's only primary, though it refuses connections
    assert pick.endpoints == f"{dead},{gw.endpoint_of(backup)}"  # the protocol's ordered list: primary, fallback
    assert a.instance == backup and a.headers["x-envoy-attempt-count"] == "2"  # Envoy went down the list
