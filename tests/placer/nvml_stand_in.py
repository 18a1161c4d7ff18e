"""The stand-in NVML driver (`stand_in_nvml.c`): build it, write its device table, and run
Python against it.

pynvml loads `libnvidia-ml.so.1` once per process through the dynamic loader, so code that
should see the stand-in runs in a child process whose LD_LIBRARY_PATH finds it first: the
same loader path a real driver takes, with pynvml and `policyc.placer.nvml` unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("stand_in_nvml.c")
ROOT = Path(__file__).resolve().parents[2]


class BuildFailed(Exception):
    """The stand-in could not be compiled here (no C compiler or no C library headers)."""


def built(tmp_path_factory: Any) -> Path:
    """The stand-in built for a test module (`tmp_path_factory` is pytest's). As root or
    under CI (where `scripts/setup.sh` installs gcc) a failed build fails the tests;
    elsewhere it skips them, saying why."""
    import pytest

    try:
        return build(tmp_path_factory.mktemp("nvml-driver"))
    except BuildFailed as e:
        if os.geteuid() == 0 or os.environ.get("CI", "").lower() == "true":
            pytest.fail(str(e))
        pytest.skip(str(e))


def build(dest: Path) -> Path:
    """Compile the stand-in into `dest/libnvidia-ml.so.1`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise BuildFailed("no C compiler (cc / gcc) to build the stand-in NVML driver")
    p = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", str(dest / "libnvidia-ml.so.1"), str(SOURCE)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise BuildFailed(f"{cc} could not build the stand-in NVML driver:\n{p.stderr}")
    return dest


@dataclass(frozen=True)
class Gpu:
    """One line of the device table: what NVML reports for one GPU."""

    name: str = "NVIDIA H100 80GB HBM3"
    bus_id: str = "00000000:3B:00.0"
    sm_util: int = 20  # %
    mem_util: int = 10  # %
    mem_total: int = 80 * 2**30
    mem_free: int = 70 * 2**30
    sm_clock: int = 1980  # MHz
    max_sm_clock: int = 1980
    pcie_tx: int = 0  # KB/s
    pcie_rx: int = 0
    link_gen: int = 5
    link_width: int = 16
    ecc_uncorrected: int = 0
    failing: tuple[tuple[str, int], ...] = ()  # (NVML call, the NVML error it returns)

    def line(self) -> str:
        failing = ",".join(f"{call}:{err}" for call, err in self.failing) or "-"
        return "|".join(str(v) for v in (
            self.name, self.bus_id, self.sm_util, self.mem_util, self.mem_total, self.mem_free, self.sm_clock,
            self.max_sm_clock, self.pcie_tx, self.pcie_rx, self.link_gen, self.link_width, self.ecc_uncorrected, failing))


def write_table(path: Path, gpus: list[Gpu], init_error: int = 0,
                procs: tuple[tuple[int, int, int, int], ...] = (), cuda: int = 0) -> None:
    """Replace the device table at once (a rename), so the driver never reads half of one.
    `procs`: (GPU index, pid, SM util %, memory util %) of the processes using the GPUs;
    `cuda`: the driver's CUDA version as NVML gives it (12040: 12.4; 0: it does not say)."""
    lines = ["# stand-in NVML device table (tests/placer/nvml_stand_in.py)"]
    if init_error:
        lines.append(f"init={init_error}")
    if cuda:
        lines.append(f"cuda={cuda}")
    lines += [g.line() for g in gpus]
    lines += [f"proc={gpu}|{pid}|{sm}|{mem}" for gpu, pid, sm, mem in procs]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def _env(driver: Path, table: Path) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(driver), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return dict(os.environ, LD_LIBRARY_PATH=path, POLICYC_STAND_IN_NVML=str(table))


def run_python(driver: Path, table: Path, code: str, *args: str, timeout: float = 120.0) -> Any:
    """Run `code` (with `args` as sys.argv[1:]) in a child Python whose NVML is the
    stand-in; it prints one JSON value as its last line, which is returned."""
    p = subprocess.run([sys.executable, "-c", code, *args], env=_env(driver, table), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_pytest(driver: Path, table: Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """Run pytest in a child process whose NVML is the stand-in."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], env=_env(driver, table),
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
