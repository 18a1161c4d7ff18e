"""`policyc demo`: the end-to-end demo on the real data plane — Envoy, KServe model servers,
policyc as the endpoint picker — on three network-namespace hosts, each with its own TPM
and agent, where root and namespaces are available, else beside the simulated cluster
(said in one line; see `demo/run.py`).

Exit codes: 0 the scenario ran as described; 1 a step did not (the step says which).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path


def register(sub) -> None:  # type: ignore[no-untyped-def]
    from .exit_codes import Exit
    from .help import add_command

    p = add_command(sub, "demo", help="compile policies/, serve, start model servers and Envoy, send a request mix, audit",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED),
                    examples=["policyc demo", "policyc demo --workdir out/   # keep the bundle and the audit log"])
    p.add_argument("--workdir", help="keep the bundle and audit log here (default: a temporary directory)")
    p.add_argument("--fleet", choices=("auto", "hosts", "simulated"), default="auto",
                   help="hosts: network-namespace hosts, each with its TPM, agent and model servers (root); simulated: the "
                        "model servers on loopback beside the simulated cluster; auto (default): hosts where root and "
                        "network namespaces are available, else simulated (said in one line)")
    p.set_defaults(func=run)


def run(args) -> int:
    from .extras import require

    require("gateway", "modelserver", command="demo")
    from policyc.demo.run import DemoError, run_demo

    logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s")
    # absolute: the demo hands paths under it to Envoy (the picker's Unix socket), which
    # takes only absolute ones, and to child processes that may run elsewhere
    workdir = Path(args.workdir).expanduser().absolute() if args.workdir else None
    if workdir is not None:
        try:
            workdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            print(f"policyc demo: error: --workdir {args.workdir}: {e.strerror or e}", file=sys.stderr)
            return 1
    try:
        return run_demo(sys.stdout, workdir, args.fleet)
    except DemoError as e:
        print(f"policyc demo: error: {e}", file=sys.stderr)
        return 1
