"""GPU-seconds of a call from NVML's per-process samples, through the stand-in NVML driver
(`tests/placer/stand_in_nvml.c`, loaded by pynvml unchanged through LD_LIBRARY_PATH).

A real serving process (a child listening on a port) is placed in a cgroup of its own as the
launcher does; the driver's table says that pid uses 50 % of GPU 0's SMs. The meter the
gateway runs (`audit/cgroup_cpu.py` with `audit/nvml_process.py`) finds the process from
the endpoint, sums its GPU time from the samples, and gives a call spanning a second about
half a GPU-second; two calls over the same second split it; a process NVML does not list
gets none. Runs in a child process, whose NVML is the stand-in.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "placer"))
import nvml_stand_in as stand_in  # noqa: E402
from nvml_stand_in import Gpu, write_table  # noqa: E402

CHILD = r"""
import json, socket, subprocess, sys, time
from pathlib import Path
from policyc.audit.cgroup_cpu import CgroupCpuMeter
from policyc.audit.nvml_process import open_nvml
from policyc.modelserver import cgroup_place
sys.path.insert(0, sys.argv[2])
from nvml_stand_in import Gpu, write_table

table = Path(sys.argv[1])
serve = "import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(60)"
servers = [subprocess.Popen([sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True) for _ in range(2)]
try:
    ports = [int(p.stdout.readline()) for p in servers]
    groups = [cgroup_place.place(p.pid) for p in servers]
    assert all(groups), groups
    write_table(table, [Gpu()], procs=((0, servers[0].pid, 50, 20),))  # the second server holds no GPU
    meter = CgroupCpuMeter(interval=0.02, gpu=open_nvml(), gpu_every=2).start()
    assert meter.gpu is not None, "no NVML"
    busy, idle = (f"127.0.0.1:{p}" for p in ports)
    for e in (busy, idle):
        meter.note(e, 0, 0, "probe")  # the first sight: the meter looks for its process
    deadline = time.time() + 20
    while not (meter.note(busy, 0, 0, "probe") and meter.note(idle, 0, 0, "probe")):
        assert time.time() < deadline, "the endpoints' processes were not found"
        time.sleep(0.05)
    time.sleep(0.3)
    start = time.time()
    time.sleep(1.0)
    end = time.time()
    for key in ("one", "two"):
        meter.note(busy, start + 0.5 if key == "two" else start, end, key)
    meter.note(idle, start, end, "other")
    while not meter.covered(busy, end + 0.25):
        time.sleep(0.05)
    time.sleep(0.3)
    out = {"one": meter.apportion_gpu(busy, start, end, "one"), "two": meter.apportion_gpu(busy, start + 0.5, end, "two"),
           "idle": meter.apportion_gpu(idle, start, end, "other"), "method": meter.gpu_method}
    meter.stop()
    print(json.dumps(out))
finally:
    for p in servers:
        p.kill()
        p.wait()
    for g in groups:
        cgroup_place.release(g)
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stand_in.built(tmp_path_factory)


def test_a_calls_gpu_seconds_come_from_nvml_per_process_samples(driver: Path, tmp_path: Path) -> None:
    table = tmp_path / "gpus.table"
    write_table(table, [Gpu()])
    got = stand_in.run_python(driver, table, CHILD, str(table), str(REPO / "tests" / "placer"))
    # one second at 50 % SM: half a GPU-second; its second half shared with call `two`
    assert got["one"] + got["two"] == pytest.approx(0.5, rel=0.2), got
    assert got["one"] == pytest.approx(0.375, rel=0.25) and got["two"] == pytest.approx(0.125, rel=0.35), got
    assert got["idle"] == 0.0, got  # a process NVML does not list used no GPU time
    assert got["method"].startswith("nvml: nvmlDeviceGetProcessUtilization") and "overlap" in got["method"]
