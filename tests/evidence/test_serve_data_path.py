"""`policyc serve --enforcer kernel` puts the kernel plane on the real data path by itself:
a plain round-robin Envoy (no picker) runs in the cgroup the service reports, the model
servers are registered over the `RegisterInstance` RPC, and then
- the TC programs the service attached count Envoy's traffic to each registered model server;
- the model server that stops answering (its streams reset by Envoy at the route timeout) trips
  the bundle's backend breaker from what the kernel saw, and its quarantine sends Envoy's new
  upstream connections to the backup until it expires, when Envoy reaches the primary again;
- the backend map follows registration, deregistration and a registry kept across a restart;
- SIGTERM leaves no TC filter, no cgroup hook, no cgroup and no clsact qdisc of the service's;
  what a SIGKILLed one left is removed by the next start; a failure to attach is exit 2 under
  `--enforcer kernel` (nothing left attached) and a warning under `auto`.

The service's counters are read from outside, as an operator would: its BPF maps (found
through its file descriptors) dumped with bpftool. Root and BPF, as in CI."""

from __future__ import annotations

import concurrent.futures as cf
import ctypes as ct
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import grpc
import pytest
from evidence_support import REPO
from gateway_rig import BACKUP, PRIMARY, SMALL, free_port, pool_layout

from policyc.client import operator_channel
from policyc.audit.query import AuditReader
from policyc.audit.records import EntryKind
from policyc.compiler import bundle_io
from policyc.compiler.bundle import Bundle
from policyc.compiler.pipeline import compile_paths
from policyc.enforcer.endpoint import Endpoint
from policyc.enforcer.kernel_abi import CBackendKey, CEndpoint
from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
from policyc.gateway.envoy_process import EnvoyProcess
from policyc.modelserver.client import OipClient, infer_request, token_ids
from policyc.modelserver.launcher import InstanceSpec, ModelPool, ServerSpec
from policyc.modelserver.model_files import write_model_files
from policyc.placer import SimulatedCluster
from policyc.server import convert
from policyc.server.proto import pb, pb_grpc

IDS = token_ids(64)
STALL = ("x-policyc-stall-ms", "3000")  # the primary holds the call; Envoy resets it at its route timeout
QUARANTINE_S = 3  # the test bundle's backend quarantine


def short_quarantine_bundle(workdir: Path) -> Bundle:
    """The shipped policies, with the backend breaker's quarantine short and allowed to take
    every registered backend (with the shipped 20 %, only one of them at a time)."""
    src = workdir / "policies"
    shutil.copytree(REPO / "policies", src)
    breakers = src / "breakers.contract"
    text = breakers.read_text()
    for old, new in (("duration: 30 s", f"duration: {QUARANTINE_S} s"), ("max_share: 20 %", "max_share: 100 %")):
        assert old in text
        text = text.replace(old, new)
    breakers.write_text(text)
    r = compile_paths([str(src)], analyse=False)
    assert r.ok and r.bundle is not None
    return r.bundle


def tc_lo() -> tuple[str, str]:
    """(the filters on lo at ingress and egress, lo's qdiscs)."""
    run = lambda *a: subprocess.run(list(a), capture_output=True, text=True).stdout  # noqa: E731
    return (run("tc", "filter", "show", "dev", "lo", "ingress") + run("tc", "filter", "show", "dev", "lo", "egress"),
            run("tc", "qdisc", "show", "dev", "lo"))


class KernelMaps:
    """A process's BPF maps by name, read with bpftool (the ids from its fds' fdinfo)."""

    def __init__(self, pid: int) -> None:
        self.ids: dict[str, str] = {}
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if "bpf-map" not in os.readlink(f"/proc/{pid}/fd/{fd}"):
                    continue
                info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            except OSError:
                continue
            mid = re.search(r"^map_id:\s*(\d+)", info, re.M)
            if mid:
                name = json.loads(subprocess.run(["bpftool", "map", "show", "id", mid[1], "-j"], capture_output=True,
                                                 text=True, check=True).stdout)["name"]
                self.ids[name] = mid[1]

    def dump(self, name: str) -> list[tuple[bytes, Any]]:
        out = subprocess.run(["bpftool", "map", "dump", "id", self.ids[name], "-j"], capture_output=True, text=True,
                             check=True).stdout
        return [(bytes(int(b, 16) for b in e["key"]), e.get("formatted", {}).get("value")) for e in json.loads(out)]

    def backends(self) -> dict[Endpoint, int]:
        return {CEndpoint.from_buffer_copy(k).endpoint(): int(v) for k, v in self.dump("backends")}

    def quarantined(self) -> set[Endpoint]:
        return {CEndpoint.from_buffer_copy(k[: ct.sizeof(CEndpoint)]).endpoint() for k, _ in self.dump("quarantine")}

    def payload_toward(self, backend_id: int) -> int:
        """TCP payload bytes TC counted at egress toward the backend."""
        for k, v in self.dump("backend_stats"):
            key = CBackendKey.from_buffer_copy(k)
            if key.id == backend_id and key.hook == 1 and key.toward == 1:
                return int(v["payload"])
        return 0


class Serve:
    """`policyc serve --enforcer kernel` as a process; its stderr lines are collected."""

    def __init__(self, bundle_path: Path, workdir: Path, *flags: str) -> None:
        self.lines: list[str] = []
        self.metrics = f"http://127.0.0.1:{free_port()}/metrics"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "policyc.cli.main", "serve", "--bundle", str(bundle_path), "--port", "0",
             "--enforcer", "kernel", "--audit-log", str(workdir / "audit.db"),
             "--metrics-address", self.metrics.split("/")[2], *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 30
        while not any("listening on" in ln for ln in self.lines):
            assert self.proc.poll() is None, f"policyc serve exited: {self.lines}"
            assert time.monotonic() < deadline, f"policyc serve did not start: {self.lines}"
            time.sleep(0.05)
        self.port = int(re.search(r"listening on [\d.]+:(\d+)", "\n".join(self.lines))[1])  # type: ignore[index]
        found = re.search(r"connect hooks on cgroup (\S+)", "\n".join(self.lines))
        assert found, f"policyc serve did not say where the connect hooks are: {self.lines}"
        self.cgroup = Path(found[1])

    def series(self, name: str) -> dict[str, float]:
        """One Prometheus metric's samples from the service's /metrics: labels text -> value."""
        text = urllib.request.urlopen(self.metrics, timeout=5).read().decode()
        return {m[1] or "": float(m[2]) for m in re.finditer(rf"^{name}(?:\{{(.*)\}})? (\S+)$", text, re.M)}

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


def serve_once(workdir: Path, *flags: str, stop_after: float | None = None) -> tuple[int, list[str], int]:
    """Run `policyc serve` with `flags` (SIGTERM once it listens, with `stop_after`): (exit
    status, stderr lines, pid)."""
    p = subprocess.Popen([sys.executable, "-m", "policyc.cli.main", "serve", "--bundle", str(workdir / "bundle.json"),
                          "--port", "0", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if stop_after is None:
        _, err = p.communicate(timeout=60)
        return p.returncode, err.splitlines(), p.pid
    assert p.stderr is not None
    lines: list[str] = []
    for line in p.stderr:
        lines.append(line.rstrip())
        if "listening on" in line:
            time.sleep(stop_after)
            p.send_signal(signal.SIGTERM)
    return p.wait(15), lines, p.pid


@pytest.fixture(scope="module")
def bundle_dir() -> Path:
    workdir = Path(tempfile.mkdtemp(prefix="policyc-serve-flags-"))
    bundle_io.write(short_quarantine_bundle(workdir), workdir / "bundle.json")
    return workdir


def leftovers_of(pid: int) -> tuple[bool, list[str]]:
    """(a TC filter on lo with the process's handle, cgroups the process made)."""
    filters, _ = tc_lo()
    root = Path(subprocess.run(["findmnt", "-rn", "-t", "cgroup2", "-o", "TARGET"], capture_output=True,
                               text=True).stdout.split()[0])
    return (f"handle 0x{(pid & 0xFFFFFF) << 8 | 1:x} " in filters,
            [p.name for p in root.glob(f"policyc-gateway-{pid}-*")])


def test_kernel_fails_closed_when_it_cannot_attach_and_leaves_nothing(bundle_dir: Path) -> None:
    # lo attaches, then the second interface does not exist: one line, exit 2, lo undone
    rc, err, pid = serve_once(bundle_dir, "--enforcer", "kernel", "--data-path-interface", "lo",
                              "--data-path-interface", "nope0")
    assert rc == 2 and err[-1] == "policyc serve: error: attaching the kernel plane to the data path: interface `nope0` not found", err
    assert all("which is gone" in ln for ln in err[:-1]), err  # at most what it reaped of others (below)
    assert leftovers_of(pid) == (False, [])


def test_auto_warns_audits_and_serves_unattached(bundle_dir: Path) -> None:
    rc, err, pid = serve_once(bundle_dir, "--enforcer", "auto", "--data-path-interface", "nope0",
                              "--audit-log", str(bundle_dir / "auto.db"), stop_after=0.2)
    assert rc == 0, err
    assert any("NOT on the data path" in ln and "nope0" in ln for ln in err), err
    assert not any("kernel plane on the data path:" in ln for ln in err), err
    with AuditReader.open(bundle_dir / "auto.db") as reader:
        failed = [e.record for e in reader.entries(kind=EntryKind.ACTION) if e.record.target == "data_path"]  # type: ignore[union-attr]
    assert len(failed) == 1 and failed[0].outcome == "failed" and "nope0" in failed[0].detail  # type: ignore[union-attr]
    assert leftovers_of(pid) == (False, [])


def test_a_killed_service_is_reaped_and_its_kept_registry_is_in_the_backend_map_at_the_next_start(bundle_dir: Path) -> None:
    """SIGKILL gives no chance to detach, and BPF attachments outlive their process: the next
    `policyc serve` removes the dead one's TC filters and its (empty) cgroup, hooks and all.
    With `--state-dir` the registry survives, and the new service's backend map follows it
    at start, without anyone registering again (nothing needs to answer on these endpoints)."""
    bundle = bundle_io.load(bundle_dir / "bundle.json")
    slots = pool_layout(bundle, SimpleNamespace(cluster=SimulatedCluster(  # type: ignore[arg-type]
        SMALL.seed, SMALL.hosts, SMALL.gpus_per_host, hosts_per_rack=SMALL.hosts_per_rack)), primaries=1)
    files = bundle_dir / "models"
    model = {PRIMARY: write_model_files(bundle.contract(PRIMARY), files).full,  # type: ignore[arg-type]
             BACKUP: write_model_files(bundle.contract(BACKUP), files, simplified=True).full}  # type: ignore[arg-type]
    endpoint = {PRIMARY: Endpoint.parse("127.0.0.1:7001"), BACKUP: Endpoint.parse("127.0.0.1:7002")}
    state = bundle_dir / "state"
    first = Serve(bundle_dir / "bundle.json", bundle_dir, "--state-dir", str(state))
    try:
        with operator_channel(f"127.0.0.1:{first.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s in slots:
                inst = s.instance.model_copy(update={"deployment": s.instance.deployment.model_copy(
                    update={"endpoint": str(endpoint[s.model])})})
                stub.RegisterInstance(convert.register_request(inst, onnx_model=model[s.model].read_bytes()), timeout=10)
        wait_for("the primary in the first service's backend map",
                 lambda: endpoint[PRIMARY] in KernelMaps(first.proc.pid).backends())
    finally:
        first.proc.kill()
        first.proc.wait(10)
    left = leftovers_of(first.proc.pid)
    assert left[0] and len(left[1]) == 1, left  # what the kill left: its filters, its cgroup with its hooks
    again = Serve(bundle_dir / "bundle.json", bundle_dir, "--state-dir", str(state))
    try:
        # (another policyc on this machine may have reaped them first: either way they are gone)
        assert leftovers_of(first.proc.pid) == (False, [])
        assert left[1][0] not in subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout
        maps = KernelMaps(again.proc.pid)
        wait_for("the kept primary in the restarted service's backend map", lambda: endpoint[PRIMARY] in maps.backends())
        assert endpoint[BACKUP] not in maps.backends()
    finally:
        assert again.stop() == 0, again.lines


def test_data_path_flags_without_the_kernel_plane_are_refused(bundle_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from policyc.cli.main import main

    for flags, why in ((("--enforcer", "userspace", "--gateway-cgroup", "/sys/fs/cgroup"),
                        "need --enforcer kernel or auto, not userspace"),
                       (("--enforcer", "kernel", "--gateway-cgroup", str(bundle_dir)), "not a cgroup v2 directory"),
                       (("--enforcer", "kernel", "--data-path-interface", "a/b"), "is not an interface name")):
        assert main(["serve", "--bundle", str(bundle_dir / "bundle.json"), "--port", "0", *flags]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("policyc serve: error: --") and why in err[0], err


@pytest.fixture(scope="module")
def world() -> Iterator[SimpleNamespace]:
    workdir = Path(tempfile.mkdtemp(prefix="policyc-serve-path-"))
    bundle = short_quarantine_bundle(workdir)
    bundle_io.write(bundle, workdir / "bundle.json")
    filters_before, qdisc_before = tc_lo()
    serve = Serve(workdir / "bundle.json", workdir)
    models = envoy = None
    try:
        slots = pool_layout(bundle, SimpleNamespace(cluster=SimulatedCluster(  # type: ignore[arg-type]
            SMALL.seed, SMALL.hosts, SMALL.gpus_per_host, hosts_per_rack=SMALL.hosts_per_rack)), primaries=1)
        files = workdir / "models"
        full = write_model_files(bundle.contract(PRIMARY), files)  # type: ignore[arg-type]
        lite = write_model_files(bundle.contract(BACKUP), files, simplified=True)  # type: ignore[arg-type]
        models = ModelPool([ServerSpec((InstanceSpec(s.instance_id, full.full),), stall_control=True)
                            if s.model == PRIMARY else
                            ServerSpec((InstanceSpec(s.instance_id, lite.full, lite.simplified, name=BACKUP,
                                                     aliases=(PRIMARY,)),)) for s in slots],
                           workdir=workdir / "servers").start(timeout=60)
        endpoint = {s.model: Endpoint.parse(models.endpoint(s.instance_id)) for s in slots}
        listen = f"127.0.0.1:{free_port()}"
        spec = GatewaySpec(picker="127.0.0.1:1", use_picker=False, listen=listen, admin=f"127.0.0.1:{free_port()}",
                           endpoints=tuple(str(e) for e in endpoint.values()), route_timeout_ms=300)
        envoy = EnvoyProcess(build_bootstrap(spec), workdir / "envoy").start()
        (serve.cgroup / "cgroup.procs").write_text(f"{envoy.pid}\n")  # the gateway runs in the hooked cgroup
        registrations = {}
        with operator_channel(f"127.0.0.1:{serve.port}") as ch:
            stub = pb_grpc.DecisionsStub(ch)
            for s in slots:
                inst = s.instance.model_copy(update={"deployment": s.instance.deployment.model_copy(
                    update={"endpoint": models.endpoint(s.instance_id)})})
                f = full.full if s.model == PRIMARY else lite.full
                registrations[s.model] = convert.register_request(inst, onnx_model=f.read_bytes())
                stub.RegisterInstance(registrations[s.model], timeout=10)
        yield SimpleNamespace(serve=serve, envoy=envoy, models=models, listen=listen, endpoint=endpoint,
                              registrations=registrations, ids={s.model: s.instance_id for s in slots},
                              maps=KernelMaps(serve.proc.pid), workdir=workdir, before=(filters_before, qdisc_before))
    finally:
        serve.stop()
        for step in (envoy.stop if envoy else None, models.stop if models else None):
            if step is not None:
                try:
                    step()
                except Exception:  # noqa: BLE001 - stop everything that was started
                    pass


def wait_for(what: str, check, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def test_tc_counts_envoys_traffic_to_the_registered_model_server(world: SimpleNamespace) -> None:
    primary, backup = world.endpoint[PRIMARY], world.endpoint[BACKUP]
    # the backend map follows the registry: the primary, whose contract's redirect breaker
    # names the backup model, is registered (the backup, with no backup of its own, is not)
    backends = wait_for("the registered primary in the kernel's backend map", lambda: world.maps.backends().get(primary))
    assert backup not in world.maps.backends()
    before = world.maps.payload_toward(backends)
    with OipClient(world.listen) as client:
        answers = [client.infer(PRIMARY, IDS, timeout=10) for _ in range(6)]
    to_primary = [a for a in answers if a.instance.startswith(PRIMARY + "@")]
    assert len(to_primary) == 3 and len(answers) - len(to_primary) == 3  # Envoy's round robin over both
    sent = world.maps.payload_toward(backends) - before
    request = infer_request(PRIMARY, IDS).ByteSize()
    # TCP payload toward the primary: its three requests, plus HTTP/2 framing and headers
    assert 3 * request <= sent <= 3 * request + 3 * 2048 + 4096, (sent, request)
    print(f"\nTC payload toward the primary: {sent} B for 3 requests of {request} B")
    # the service shows the same counters, and where it is attached, on its metrics endpoint
    shown = world.serve.series("policyc_kernel_backend_payload_bytes_total")
    assert shown[f'backend="{primary}",direction="toward"'] == world.maps.payload_toward(backends)
    assert shown[f'backend="{primary}",direction="from"'] > 0  # the answers
    assert world.serve.series("policyc_data_path_info") == {f'cgroup="{world.serve.cgroup}",interfaces="lo"': 1.0}


def test_a_failing_model_server_is_quarantined_onto_its_backup_then_released(world: SimpleNamespace) -> None:
    primary, backup = world.endpoint[PRIMARY], world.endpoint[BACKUP]
    stop = threading.Event()
    first: dict[str, float] = {}

    def stalled_calls() -> None:  # half of them reach the primary, which holds them past Envoy's timeout
        with OipClient(world.listen) as client:
            while not stop.is_set():
                try:
                    client.infer(PRIMARY, IDS, metadata=(STALL,), timeout=5)
                except grpc.RpcError:
                    first.setdefault("failed", time.monotonic())

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(stalled_calls) for _ in range(4)]
        try:
            wait_for("the backend breaker's quarantine in the kernel map", lambda: primary in world.maps.quarantined(), 10)
        finally:
            stop.set()
        for r in runs:
            r.result()
    tripped = time.monotonic() - t0
    print(f"\nquarantined {tripped:.2f} s after the primary stopped answering")
    # Envoy's connection to the primary was ended; its new one lands on the backup, in the kernel
    with OipClient(world.listen) as client:
        answers = [client.infer(PRIMARY, IDS, timeout=10) for _ in range(6)]
    assert all(a.instance.startswith(BACKUP + "@") for a in answers), [a.instance for a in answers]
    # the quarantine expires: the service releases it (and audits the release)
    wait_for("the quarantine's release", lambda: primary not in world.maps.quarantined(), QUARANTINE_S + 3)
    assert backup not in world.maps.quarantined()
    # released, the connection the kernel sent to the backup is ended too: Envoy's next one
    # reaches the primary again (kept, it would carry the primary's share to the backup for good)
    def back_on_the_primary() -> bool:
        with OipClient(world.listen) as client:
            return sum(client.infer(PRIMARY, IDS, timeout=10).instance.startswith(PRIMARY + "@") for _ in range(4)) == 2
    wait_for("Envoy's calls to the primary answered by it again", back_on_the_primary, 3)


def test_the_backend_map_follows_deregistration_and_registration(world: SimpleNamespace) -> None:
    primary = world.endpoint[PRIMARY]
    bid = world.maps.backends()[primary]
    with operator_channel(f"127.0.0.1:{world.serve.port}") as ch:
        stub = pb_grpc.DecisionsStub(ch)
        # the backup leaves: the primary has nowhere to be quarantined to, so it leaves the map
        stub.DeregisterInstance(pb.DeregisterInstanceRequest(instance_id=world.ids[BACKUP]), timeout=10)
        wait_for("the primary out of the backend map", lambda: primary not in world.maps.backends())
        stub.RegisterInstance(world.registrations[BACKUP], timeout=10)
        # back, counted under the same id as before
        assert wait_for("the primary back in the backend map", lambda: world.maps.backends().get(primary)) == bid


def test_sigterm_detaches_everything(world: SimpleNamespace) -> None:  # last: it stops the service
    serve = world.serve
    handle = f"handle 0x{(serve.proc.pid & 0xFFFFFF) << 8 | 1:x} "
    filters, _ = tc_lo()
    assert handle in filters  # ours, while it runs
    hooks = subprocess.run(["bpftool", "cgroup", "show", str(serve.cgroup)], capture_output=True, text=True).stdout
    assert "connect4" in hooks and "connect6" in hooks
    world.envoy.stop()  # the gateway goes first, as an operator would stop it
    assert serve.stop() == 0, serve.lines
    filters, qdisc = tc_lo()
    assert handle not in filters
    assert not serve.cgroup.exists()
    assert str(serve.cgroup) not in subprocess.run(["bpftool", "cgroup", "tree"], capture_output=True, text=True).stdout
    if "clsact" not in world.before[1] and "bpf" not in filters:  # the service added lo's clsact: it removed it
        assert "clsact" not in qdisc, qdisc
    with AuditReader.open(world.workdir / "audit.db") as reader:
        actions = [e.record for e in reader.entries(kind=EntryKind.ACTION)]
    primary, backup = str(world.endpoint[PRIMARY]), str(world.endpoint[BACKUP])
    # the whole story, in order: the breaker's quarantine, Envoy's connection ended, its new
    # connect rewritten in the kernel, the release at expiry (the audit log files the acts it
    # has no kind for under report_anomaly, tagged with their own)
    story = [f"{a.kind} {a.detail}" for a in actions if a.target == primary and a.outcome == "done"  # type: ignore[union-attr]
             and "map_change" not in a.detail]  # type: ignore[union-attr]
    expected = [f"quarantine to {backup} for {QUARANTINE_S} s", "[end_connections] ",
                f"[kernel_redirect] connect to {primary} rewritten to {backup}", "release quarantine expired",
                "connection(s) redirected to its backup ended; new ones reach it again"]
    q, ended, redirected, released, back = (next((i for i, line in enumerate(story) if what in line), -1) for what in expected)
    # (the connection's end and the new connect's rewrite race: Envoy may reconnect for a call
    # in flight before the guardian has written that `ss -K` is done)
    assert -1 not in (q, ended, redirected, released, back), story
    assert q < min(ended, redirected) and max(ended, redirected) < released < back, story
    # the kernel flags streams over the bundle's tightest budget, and the audit log keeps those
    # of the registered model servers only: the primary's (reset at Envoy's 300 ms), never the
    # clients' own 300 ms streams to Envoy, nor anything else on lo
    slow = [a.target for a in actions if "[stream_over_budget]" in a.detail]  # type: ignore[union-attr]  # client->server#stream
    assert slow and all(t.partition("->")[2].rpartition("#")[0] == primary for t in slow), slow[:5]
