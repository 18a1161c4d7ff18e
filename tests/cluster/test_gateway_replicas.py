"""Envoy reaching several pickers: two policyc replicas (sharing their fleet through etcd)
each run the ext_proc endpoint picker; Envoy's picker cluster holds both, with gRPC health
checks and outlier detection (`GatewaySpec.pickers`). Real Envoy, real KServe model servers. Both pickers serve;
when one replica dies, only requests in flight on it fail (the gateway's failure mode,
here: refuse), and every later request is picked by the other."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import grpc
import pytest
from cluster_rig import eventually, new_prefix, replica

from policyc.client import operator_channel
from policyc.cluster.local_etcd import free_ports
from policyc.gateway.bootstrap import PICKER_CLUSTER, GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.gateway.picker import PickerConfig
from policyc.gateway.server import PickerServer
from policyc.modelserver.client import OipClient, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.server import convert
from policyc.server.config import ClusterSpec
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb_grpc

MODEL, BACKUP = "fraud-scorer", "fraud-scorer-lite"
FLEET = ClusterSpec(seed=1, hosts=32, gpus_per_host=4, hosts_per_rack=4)
BASE = (("x-model", MODEL), ("x-data-region", "us-west"), ("x-tenant", "acme-bank"))


@pytest.fixture
def two_replicas_behind_envoy(bundle, etcd):  # type: ignore[no-untyped-def]
    work = Path(tempfile.mkdtemp(prefix="policyc-cluster-gw-"))
    prefix = new_prefix()
    reps = [replica(bundle, etcd, f"g{i}", prefix, cluster=FLEET) for i in range(2)]
    started: list[object] = []
    try:
        fleet = admissible_fleet(bundle, reps[0].server.cluster.gpu_slots(), models=[MODEL, BACKUP])
        primaries = [i for i in fleet if i.model == MODEL]
        chosen = [primaries[0], next(i for i in primaries if i.deployment.host != primaries[0].deployment.host),
                  next(i for i in fleet if i.model == BACKUP)]
        full = write_model_files(bundle.contract(MODEL), work / "models")  # type: ignore[arg-type]
        lite = write_model_files(bundle.contract(BACKUP), work / "models", simplified=True)  # type: ignore[arg-type]
        models = ModelPool([ServerSpec((InstanceSpec(chosen[0].id, full.full),)), ServerSpec((InstanceSpec(chosen[1].id, full.full),)),
                            ServerSpec((InstanceSpec(chosen[2].id, lite.full, lite.simplified, name=BACKUP, aliases=(MODEL,)),))],
                           workdir=work / "servers").start(timeout=60)
        started.append(models)
        with operator_channel(f"127.0.0.1:{reps[0].server.port}") as ch:  # registered on one replica ...
            stub = pb_grpc.DecisionsStub(ch)
            for inst, f in zip(chosen, (full.full, full.full, lite.full)):
                inst = inst.model_copy(update={"deployment": inst.deployment.model_copy(update={"endpoint": models.endpoint(inst.id)})})
                stub.RegisterInstance(convert.register_request(inst, onnx_model=f.read_bytes()), timeout=10)
        for th in reps:  # ... served by both
            eventually(lambda th=th: all(i.id in th.server.state.registry for i in chosen), 5)
        pickers = [PickerServer(th.server, PickerConfig()) for th in reps]
        ports = [th.call(p.start()) for th, p in zip(reps, pickers)]
        listen, admin = free_ports(2)
        spec = GatewaySpec(picker=f"127.0.0.1:{ports[0]}", pickers=tuple(f"127.0.0.1:{p}" for p in ports), listen=f"127.0.0.1:{listen}", admin=f"127.0.0.1:{admin}",
                           endpoints=tuple(i.endpoint for i in models.instances), failure_mode_allow=False,
                           picker_timeout_ms=2000)  # a loaded 2-core machine: a slow pick is not what is tested
        envoy = EnvoyProcess(build_bootstrap(spec), work / "envoy").start()
        started.append(envoy)
        yield reps, pickers, envoy, f"127.0.0.1:{listen}"
    finally:
        for x in reversed(started):
            try:
                x.stop()  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - stop everything that started
                pass
        for th in reps:
            th.stop()
        shutil.rmtree(work, ignore_errors=True)


def test_envoy_reaches_every_replicas_picker_and_a_dead_replica_costs_only_its_in_flight_requests(two_replicas_behind_envoy) -> None:
    reps, pickers, envoy, listen = two_replicas_behind_envoy
    ids = token_ids(32)
    with OipClient(listen) as c:
        eventually(lambda: _ok(c, ids), 20, step=0.2)  # Envoy's health checks have both pickers up
    results: list[tuple[float, float, bool]] = []  # start, end, answered
    stop = threading.Event()

    def load() -> None:
        with OipClient(listen) as c:
            while not stop.is_set():
                t0 = time.monotonic()
                ok = _ok(c, ids)
                results.append((t0, time.monotonic(), ok))
                time.sleep(0.05)  # paced: one primary's GPU share per tick is the capacity, not what is tested

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    per_picker = {h: st for h, st in envoy.host_stats(PICKER_CLUSTER).items() if ":" in h}
    assert len(per_picker) == 2 and all(s.get("rq_total", 0) > 0 for s in per_picker.values()), per_picker
    assert _picker_failures(envoy) == 0
    killed_at = time.monotonic()
    reps[0].call(pickers[0].stop(grace=0))  # replica g0 dies: its picker's streams are reset, its port closed
    reps[0].call(reps[0].server.replica.crash())
    time.sleep(0.5)
    at_half_second = _picker_failures(envoy)
    dead = f"127.0.0.1:{pickers[0].port}"
    dead_rq = envoy.host_stats(PICKER_CLUSTER)[dead].get("rq_total", 0)
    time.sleep(1.5)
    stop.set()
    for t in threads:
        t.join(10)
    # the failure mode (refuse) costs what was in flight on the dead picker, or reached it
    # before Envoy's health check ejected it: a few, never more than the callers in flight
    assert at_half_second <= len(threads), f"{at_half_second} ext_proc streams failed after the kill"
    assert _picker_failures(envoy) == at_half_second, "a request reached the dead picker after it was ejected"
    assert envoy.host_stats(PICKER_CLUSTER)[dead].get("rq_total", 0) == dead_rq
    served_before = [ok for t0, t1, ok in results if t1 < killed_at]
    served_after = [ok for t0, t1, ok in results if t0 >= killed_at + 0.5]
    # every later request was picked by the surviving replica (what else may fail there is
    # the data plane's own doing on this loaded machine: a per-try timeout on the primary and
    # then the backup, or a simulated GPU whose health fell; never the picker)
    assert served_before.count(True) > 20 and served_after.count(True) > 20, sorted(set(ERRORS))[:6]


def _picker_failures(envoy: EnvoyProcess) -> int:
    st = envoy.stats("http.policyc_gateway.ext_proc.")
    return st.get("http.policyc_gateway.ext_proc.streams_failed", 0) + st.get("http.policyc_gateway.ext_proc.message_timeouts", 0)


ERRORS: list[str] = []


def _ok(c: OipClient, ids) -> bool:  # type: ignore[no-untyped-def]
    try:
        c.infer(MODEL, ids, metadata=BASE, timeout=5)
        return True
    except grpc.RpcError as e:
        ERRORS.append(f"{e.code()}: {e.details()}"[:300])  # type: ignore[attr-defined]
        return False
