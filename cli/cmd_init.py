"""`policyc init DIR`: a project to start from, written from the examples that ship in the package.

Writes `DIR/policies/` (the example contracts, request headers, policies, breakers and GPU
catalog; the same files as `policyc docs --examples` names), `DIR/policies/tests/` (a
`*_test.toml` test file, see `policyc docs`) and `DIR/fleet/` (one `RegisterInstanceRequest`
JSON per instance: instances of the example contracts on GPUs of the simulated cluster that
`policyc serve` starts with by default, each admitted by its contract). Then:

    cd DIR
    policyc check policies/
    policyc test policies/
    policyc compile policies/ -o bundle.json
    policyc serve --bundle bundle.json &
    for f in fleet/*.json; do policyc instance register --file "$f"; done
    policyc decide --header X-SLO-Latency=150ms --header X-Data-Region=us-west

Refuses to overwrite an existing file (`--force` replaces them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exit_codes import Exit
from .help import add_command

# the examples of the package that make one consistent project (policies/ also holds
# deliberately broken files and versioned variants, which a new project should not start from)
EXAMPLES = ("gpu-catalog.contract", "fraud-scorer.contract", "recommender.contract", "clinical-notes.contract",
            "chatbot.contract", "requests.contract", "routing.contract", "breakers.contract")
TESTS = ("tests/routing_test.toml",)
PER_MODEL = 2  # fleet fixture: instances per example contract


def examples_dir() -> Path:
    """Where the example policies lie in the installed package (`policyc.examples`)."""
    from policyc.examples import POLICIES

    return POLICIES


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "init", help="write example policies, a test file and a fleet fixture to start from",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc init my-policies", "policyc init . --force"])
    p.add_argument("dir", metavar="DIR", help="the folder to write (created if missing)")
    p.add_argument("--force", action="store_true", help="replace files that exist")
    p.set_defaults(func=run)


def _fail(msg: str, code: int = Exit.USAGE) -> int:
    print(f"policyc init: error: {msg}", file=sys.stderr)
    return int(code)


def fleet_requests(policies: list[Path], per_model: int = PER_MODEL) -> dict[str, str] | str:
    """{file name: RegisterInstanceRequest JSON} for instances of the compiled `policies` on
    the default simulated cluster (`policyc serve`'s `--sim-*` defaults), each admitted by
    its contract; or the compiler's diagnostics when the policies do not compile."""
    from google.protobuf import json_format

    from policyc.compiler.pipeline import compile_paths
    from policyc.dsl.diagnostics import render_text
    from policyc.placer import SimulatedCluster
    from policyc.server import convert
    from policyc.server.config import ClusterSpec
    from policyc.server.fleet import admissible_fleet

    result = compile_paths(policies, analyse=False)
    if result.bundle is None:
        return render_text(result.diagnostics, result.sources)
    spec = ClusterSpec()
    cluster = SimulatedCluster(spec.seed, spec.hosts, spec.gpus_per_host, hosts_per_rack=spec.hosts_per_rack)
    chosen: dict[str, int] = {}
    out: dict[str, str] = {}
    for inst in admissible_fleet(result.bundle, cluster.topology().gpu_slots()):
        if chosen.get(inst.model, 0) >= per_model:
            continue
        n = chosen[inst.model] = chosen.get(inst.model, 0) + 1
        ident = f"{inst.model}-{n}"
        msg = convert.register_request(inst.model_copy(update={"id": ident}))
        out[f"{ident}.json"] = json_format.MessageToJson(msg, indent=2) + "\n"
    return out


def run(args: argparse.Namespace) -> int:
    src = examples_dir()
    root = Path(args.dir)
    files: dict[Path, str] = {}
    try:
        for name in (*EXAMPLES, *TESTS):
            files[root / "policies" / name] = (src / name).read_text(encoding="utf-8")
    except OSError as e:
        return _fail(f"the package's examples are missing ({e.filename}): reinstall policyc", Exit.FAILED)
    fleet = fleet_requests(src_subset(src))
    if isinstance(fleet, str):
        print(fleet, file=sys.stderr)
        return _fail("the package's example policies do not compile", Exit.FAILED)
    for name, text in fleet.items():
        files[root / "fleet" / name] = text
    existing = [p for p in files if p.exists()]
    if existing and not args.force:
        return _fail(f"{existing[0]} exists ({len(existing)} of the files to write do); --force replaces them")
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as e:
        return _fail(f"{e.filename}: {e.strerror or e}")
    print(f"wrote {len(EXAMPLES)} policy files, {len(TESTS)} test file and {len(fleet)} fleet instances under {root}/")
    print("next:")
    for line in (f"cd {root}", "policyc check policies/", "policyc test policies/", "policyc compile policies/ -o bundle.json",
                 "policyc serve --bundle bundle.json &",
                 'for f in fleet/*.json; do policyc instance register --file "$f"; done',
                 "policyc decide --header X-SLO-Latency=150ms --header X-Data-Region=us-west"):
        print(f"  {line}")
    return 0


def src_subset(src: Path) -> list[Path]:
    """The example files `init` writes, as compile inputs (not the whole examples folder)."""
    return [src / name for name in EXAMPLES]
