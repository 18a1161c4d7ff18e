"""A host's own facts decide what may be claimed about it, on every path an instance takes
into a replica (a real etcd, a replica, a real `policyc agent run` process whose NVML is
the project's stand-in driver):

- the agent reports its GPUs (class, memory), the CUDA driver version and the operator's
  site facts, each with its source, and the replica keeps them as the host's;
- the instance of a server the agent supervises leaves its GPU class, CUDA, region and
  hardware firewall out: the agent fills them from its host, and the fleet serves it so;
- RegisterInstance (and RegisterInstances, item by item) of an instance whose claims its host's agent contradicts is refused
  (FAILED_PRECONDITION, E733, naming the field, both values and the source);
- a record written straight into etcd gets no further: one whose claims the host
  contradicts, and one whose endpoint is another host's address, are not served, by the
  watch of a running replica nor from the snapshot of one that starts later, each logged
  with RegisterInstance's own words; a record that agrees is served by both."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import grpc
import pytest
from agent_rig import eventually, new_prefix, replica
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from policyc.cluster import instance_codec
from policyc.cluster.etcd_store import EtcdStore
from policyc.cluster.host_facts import discover
from policyc.cluster.keys import Keys
from policyc.matcher import Instance
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb, pb_grpc

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "placer"))
import nvml_stand_in as stand_in  # noqa: E402
from nvml_stand_in import Gpu, write_table  # noqa: E402

POLICYC = [sys.executable, "-m", "policyc.cli.main"]
HOST = "host-0003"  # simulated: us-west, CUDA 12.4, four H100, no TPM


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.built(tmp_path_factory)


def _address() -> str:
    """A routable address of this machine's network namespace (the agent's host's own)."""
    routable = sorted(discover("probe").routable(), key=lambda a: (":" in a, a))
    if not routable:
        pytest.fail("this machine's network namespace has no routable address for the agent to report")
    return routable[0]


def _endpoint(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    import threading

    lp = asyncio.new_event_loop()
    t = threading.Thread(target=lp.run_forever, daemon=True)
    t.start()
    yield lp
    lp.call_soon_threadsafe(lp.stop)
    t.join(5)
    lp.close()


def _request(inst: Instance) -> pb.RegisterInstanceRequest:
    dep = {k: v for k, v in inst.deployment.model_dump().items() if k in pb.Deployment.DESCRIPTOR.fields_by_name}
    return pb.RegisterInstanceRequest(id=inst.id, model=inst.model, deployment=pb.Deployment(**dep))


def _rpc_refusal(th: Any, inst: Instance) -> tuple[grpc.StatusCode, str, error_details_pb2.ErrorInfo]:
    with grpc.insecure_channel(f"127.0.0.1:{th.server.port}") as ch, pytest.raises(grpc.RpcError) as err:
        pb_grpc.DecisionsStub(ch).RegisterInstance(_request(inst), timeout=60)
    st = rpc_status.from_call(err.value)  # type: ignore[arg-type]
    assert st is not None
    info = error_details_pb2.ErrorInfo()
    next(d for d in st.details if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR)).Unpack(info)
    return err.value.code(), err.value.details(), info  # type: ignore[attr-defined]


def test_the_hosts_own_facts_fill_its_servers_and_refuse_claims_by_rpc_watch_and_snapshot(
        bundle, etcd, driver, tmp_path, loop, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="policyc.cluster")
    prefix, addr = new_prefix(), _address()
    keys = Keys(prefix)
    table = tmp_path / "gpus.table"
    write_table(table, [Gpu(), Gpu(name="NVIDIA A100-SXM4-80GB", bus_id="00000000:86:00.0")], cuda=12080)
    spec = tmp_path / "servers.json"
    spec.write_text(json.dumps([{  # the instance names its host, GPU and endpoint; the agent fills the rest
        "name": "rec-0", "argv": ["sleep", "300"], "numa_node": 0, "cpus": "0",
        "instance": {"id": f"recommender@{HOST}/gpu0", "model": "recommender",
                     "deployment": {"host": HOST, "gpu": "gpu0", "endpoint": _endpoint(addr, 18080)}}}]))
    r0 = replica(bundle, etcd, "r0", prefix)
    env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(p for p in (str(driver), os.environ.get("LD_LIBRARY_PATH", "")) if p),
               POLICYC_STAND_IN_NVML=str(table))
    agent = subprocess.Popen([*POLICYC, "agent", "run", "--host", HOST, "--signal-period", "0", "--servers", str(spec),
                              "--region", "eu-west", "--zone", "eu-west-1b", "--hardware-firewall", "false",
                              "--etcd", *etcd.endpoints, "--etcd-prefix", prefix],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    store = EtcdStore(etcd.endpoints)

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(60)
    run(store.connect())
    r1 = None
    try:
        assert agent.stdout is not None
        line = agent.stdout.readline()
        assert f"host {HOST} ready" in line, line + (agent.stderr.read() if agent.poll() is not None and agent.stderr else "")
        rep = r0.server.replica
        eventually(lambda: HOST in rep.host_facts and rep.host_facts[HOST].hardware is not None, 30, step=0.05)
        hw = rep.host_facts[HOST].hardware
        assert hw is not None and hw.gpus is not None
        assert [(g.id, g.gpu_class) for g in hw.gpus] == [("gpu0", "H100"), ("gpu1", "A100-80G")]
        assert hw.cuda == "12.8" and hw.site.region == "eu-west" and hw.site.zone == "eu-west-1b" and hw.site.hardware_firewall is False
        assert "NVML" in hw.sources["gpus"] and hw.sources["site.region"].startswith("the operator")

        # the supervised server's instance, filled from its host, served
        served = f"recommender@{HOST}/gpu0"
        eventually(lambda: served in r0.server.state.registry, 30, step=0.05)
        d = r0.server.state.registry.get(served).deployment
        assert (d.gpu_model, d.cuda, d.region, d.hardware_firewall) == ("H100", "12.8", "eu-west", False)

        # RegisterInstance with the simulator's facts for host-0003/gpu1 (H100): its agent says A100-80G
        sim = next(i for i in admissible_fleet(bundle, r0.server.cluster.gpu_slots(), models=["recommender"])
                   if i.deployment.host == HOST and i.deployment.gpu == "gpu1")
        code, why, info = _rpc_refusal(r0, sim)
        assert code == grpc.StatusCode.FAILED_PRECONDITION and info.reason == "E733", why
        assert f"`deployment.gpu_model` is `H100` but host `{HOST}`'s agent reports {HOST}/gpu1 as `A100-80G` (NVML" in why
        assert sim.id not in r0.server.state.registry
        # RegisterInstances: the same refusal for that item, the others registered
        items = [_request(sim), _request(next(i for i in admissible_fleet(bundle, r0.server.cluster.gpu_slots(), models=["recommender"])
                                              if i.deployment.host == "host-0001"))]
        with grpc.insecure_channel(f"127.0.0.1:{r0.server.port}") as ch:
            got = list(pb_grpc.DecisionsStub(ch).RegisterInstances(pb.RegisterInstancesRequest(instances=items), timeout=60).results)
        assert [(r.registered, r.code, r.field) for r in got] == [(False, "E733", "deployment.gpu_model"), (True, "", "")], got
        assert "A100-80G" in got[0].message and sim.id not in r0.server.state.registry

        # straight into etcd: a claim its host contradicts, an endpoint on another host's address, and one that agrees
        good = Instance.model_validate({"id": f"recommender@{HOST}/gpu1", "model": "recommender", "deployment": {
            "host": HOST, "gpu": "gpu1", "gpu_model": "A100-80G", "region": "eu-west", "cuda": "12.8",
            "endpoint": _endpoint(addr, 18081)}})
        contradicted = good.model_copy(update={"id": "liar@host-0003/gpu1",
                                               "deployment": good.deployment.model_copy(update={"region": "us-west"})})
        elsewhere = next(i for i in admissible_fleet(bundle, r0.server.cluster.gpu_slots(), models=["recommender"])
                         if i.deployment.host == "host-0001")
        elsewhere = elsewhere.model_copy(update={"deployment": elsewhere.deployment.model_copy(update={"endpoint": "198.18.0.5:8000"})})
        for inst in (contradicted, elsewhere, good):
            run(store.put(keys.instance(inst.id), instance_codec.encode(inst, None)))
        eventually(lambda: good.id in r0.server.state.registry, 30, step=0.05)
        eventually(lambda: {contradicted.id, elsewhere.id} <= set(rep._said_refused), 30, step=0.05)
        assert contradicted.id not in r0.server.state.registry and elsewhere.id not in r0.server.state.registry
        words = {contradicted.id: f"`deployment.region` is `us-west` but host `{HOST}`'s agent reports {HOST} as `eu-west`",
                 elsewhere.id: "refused by rule `not-the-claimed-host`: 198.18.0.5 is host `host-0005`'s, not `host-0001`'s"}
        logged = "\n".join(r.getMessage() for r in caplog.records)
        for iid, w in words.items():
            assert w in rep._said_refused[iid] and f"does not serve instance {iid}" in logged and w in logged, (iid, logged[-2000:])

        # a replica that starts now: the same refusals from its snapshot, the same one served
        r1 = replica(bundle, etcd, "r1", prefix)
        dropped = {r.instance_id: r for r in r1.server.replica.dropped_at_load}
        for iid, w in words.items():
            assert w in dropped[iid].reason and dropped[iid].where == keys.instance(iid), dropped.get(iid)
        assert good.id in r1.server.state.registry and served in r1.server.state.registry
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
        run(store.close())
        if r1 is not None:
            r1.stop()
        r0.stop()
