"""A gateway that comes back (issue 36): after `kill -9` of `policyc gateway`, no child of it
(Envoy, the audit writer) lives on; a restart on the same ports serves again with the
registry it had; a leftover Envoy of its own is stopped by the next start; another process
on its ports is named, never taken for its Envoy; the audit writer's death is an exit 1
that says what was lost. Real gateway processes, real Envoy, a real model server."""

from __future__ import annotations

import http.server
import os
import signal
import statistics
import subprocess
import threading
import time
from pathlib import Path

import grpc
import pytest

from policyc.gateway.envoy_process import envoy_binary, process_gone
from policyc.modelserver.client import OipClient, token_ids

from gateway_rig import PRIMARY
from restart_rig import METADATA, GatewayProcess, children, survivors

TRIES = 3  # each a full restart (Envoy, the audit writer, the decision service): 3-7 s apiece on a loaded machine


def test_kill_9_takes_every_child_and_a_restart_serves_with_the_registry_it_had(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = GatewayProcess(bundle, tmp_path, extra=("--audit-log", str(tmp_path / "audit.db")))
    gw.start_models()
    try:
        t0 = gw.start()
        gw.register()
        gw.serving(t0)
        took = []
        for i in range(TRIES):
            envoy = int(gw.envoy_pid_file.read_text())
            kids = gw.kill9()
            assert envoy in kids, f"try {i}: Envoy {envoy} is not the gateway's child: {kids}"
            assert any("policyc.audit.writer_process" in cmd for cmd in kids.values()), kids
            left = survivors(kids)
            assert not left, f"try {i}: outlived the gateway killed with -9: {left}"
            t0 = gw.start()  # the same ports, nothing registered again
            took.append(gw.serving(t0))
            print(f"try {i}: serving {took[-1]:.2f} s after the restart's launch")
        code, err = gw.stop()
        assert code == 0, err[-3000:]
    finally:
        gw.close()
    print(f"restart to serving after kill -9, {TRIES} tries: " + ", ".join(f"{t:.2f}" for t in took)
          + f" s (median {statistics.median(took):.2f}, max {max(took):.2f})")
    # the figure is 5 s (benchmarks/gateway_restart.py measures it); here a bound a loaded CI machine keeps
    assert max(took) < 30, took


def test_a_start_stops_a_leftover_envoy_of_its_own(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """An Envoy on the gateway's own bootstrap holding its ports with no gateway above it
    (what a machine without the parent-death signal would leave): the next start stops it,
    by the pid file in the state dir, and serves."""
    gw = GatewayProcess(bundle, tmp_path)
    gw.start_models()
    orphan = None
    try:
        t0 = gw.start()
        gw.register()
        gw.serving(t0)
        code, err = gw.stop()
        assert code == 0, err[-3000:]
        config = gw.state_dir / "gateway" / "envoy.json"
        orphan = subprocess.Popen([envoy_binary(), "-c", str(config), "--disable-hot-restart", "-l", "warning"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        gw.envoy_pid_file.write_text(f"{orphan.pid}\n")
        _wait_listening(gw.listen)  # it holds the gateway's ports
        t0 = gw.start()
        gw.serving(t0)
        assert orphan.wait(timeout=15) is not None  # stopped by the start
        code, err = gw.stop()
        assert code == 0, err[-3000:]
        assert f"stopped a stale Envoy of this gateway (pid {orphan.pid})" in err, err[-3000:]
    finally:
        if orphan is not None and orphan.poll() is None:
            orphan.kill()
            orphan.wait()
        gw.close()


class _Impostor(http.server.BaseHTTPRequestHandler):
    """Another process's server on the admin port that says LIVE to anyone who asks."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        body = b"LIVE\n"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_process_answering_the_admin_port_is_named_never_taken_for_its_envoy(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    gw = GatewayProcess(bundle, tmp_path)
    gw.admin = impostor.server_address[1]
    try:
        gw.start()
        assert gw.proc is not None
        _, err = gw.proc.communicate(timeout=60)
        assert gw.proc.returncode == 2, err[-3000:]
        assert "clients ->" not in err  # never said ready on the impostor's word
        lines = [line for line in err.splitlines() if line.startswith("policyc gateway: error:")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert f"port {gw.admin} (admin) is held by pid {os.getpid()}" in lines[0], lines[0]
        assert not gw.envoy_pid_file.exists()
    finally:
        impostor.shutdown()
        gw.close()


def test_a_listener_port_held_by_another_process_is_named_not_shared(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Envoy's listener does not share its port (no SO_REUSEPORT): a port someone else
    listens on is a start that fails, naming the holder, never half the traffic each."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    gw = GatewayProcess(bundle, tmp_path)
    gw.listen = holder.getsockname()[1]
    try:
        gw.start()
        assert gw.proc is not None
        _, err = gw.proc.communicate(timeout=60)
        assert gw.proc.returncode == 2 and "clients ->" not in err, err[-3000:]
        lines = [line for line in err.splitlines() if line.startswith("policyc gateway: error:")]
        assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
        assert f"port {gw.listen} (listener policyc_gateway) is held by pid {os.getpid()}" in lines[0], lines[0]
    finally:
        holder.close()
        gw.close()


def test_the_audit_writers_death_is_an_exit_1_that_says_what_was_lost(bundle, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gw = GatewayProcess(bundle, tmp_path, extra=("--audit-log", str(tmp_path / "audit.db")))
    gw.start_models()
    try:
        t0 = gw.start()
        gw.register()
        gw.serving(t0)
        assert gw.proc is not None
        writer = next(pid for pid, cmd in children(gw.proc.pid).items() if "policyc.audit.writer_process" in cmd)
        os.kill(writer, signal.SIGKILL)
        with OipClient(f"127.0.0.1:{gw.listen}") as c:  # fails closed: refused with the reason
            deadline = time.monotonic() + 10
            while True:
                try:
                    c.infer(PRIMARY, token_ids(16), timeout=5, metadata=METADATA)
                except grpc.RpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE and "audit" in (e.details() or ""), e
                    break
                assert time.monotonic() < deadline, "still answered after the audit writer died"
                time.sleep(0.05)
        code, err = gw.stop()
        assert code == 1, err[-3000:]
        assert "did not close cleanly" in err and "decisions already acknowledged" in err, err[-3000:]
    finally:
        gw.close()


def _wait_listening(port: int, timeout: float = 20.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    pytest.fail(f"nothing listens on {port} within {timeout:g} s")


def test_process_gone_knows_a_zombie(tmp_path: Path) -> None:
    """A killed child not yet reaped holds no port: it counts as gone."""
    p = subprocess.Popen(["sleep", "30"])
    os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not process_gone(p.pid):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    p.wait()


def test_a_pid_file_naming_another_program_stops_nothing(tmp_path: Path) -> None:
    """The pid in `envoy.pid` reused by another program (or another gateway's Envoy): its
    command line says so, it is left alone and the stale file removed."""
    from policyc.gateway.bootstrap import GatewaySpec, build_bootstrap
    from policyc.gateway.envoy_process import PID_FILE, EnvoyProcess

    spec = GatewaySpec(picker="127.0.0.1:9", endpoints=("127.0.0.1:8001",))
    other = subprocess.Popen(["sleep", "30"])
    try:
        envoy = EnvoyProcess(build_bootstrap(spec), tmp_path / "gw")
        envoy.workdir.mkdir()
        (envoy.workdir / PID_FILE).write_text(f"{other.pid}\n")
        assert envoy.clear_stale() is None
        assert other.poll() is None and not (envoy.workdir / PID_FILE).exists()
        # an Envoy, but another gateway's (another directory's bootstrap)
        from gateway_rig import free_port

        theirs = EnvoyProcess(build_bootstrap(GatewaySpec(picker="127.0.0.1:9", endpoints=("127.0.0.1:8001",),
                                                          listen=f"127.0.0.1:{free_port()}", admin=f"127.0.0.1:{free_port()}")),
                              tmp_path / "elsewhere").start()
        try:
            (envoy.workdir / PID_FILE).write_text(f"{theirs.pid}\n")
            assert envoy.clear_stale() is None and theirs.alive()
        finally:
            theirs.stop()
    finally:
        other.kill()
        other.wait()
