"""`policyc validate MODEL.onnx`: fail CI when a model's counted FLOPs drift from its contract.

Exit 0 when the embedded contract is complete and the FLOPs counted from the graph lie
within the declared interval widened by the tolerance; 1 for drift, a missing or bad
contract, a graph that cannot be counted, or a file that is not an ONNX model; 2 for usage
errors.
"""

from __future__ import annotations

import argparse
import sys

from .exit_codes import Exit
from .help import add_command

EXIT_OK, EXIT_GATE, EXIT_USAGE = 0, 1, 2


def _dims(values: list[str]) -> dict[str, int] | str:
    out: dict[str, int] = {}
    for v in values:
        name, sep, num = v.partition("=")
        if not sep or not name or not num.isdigit() or int(num) <= 0:
            return f"--dim expects NAME=POSITIVE_INT, got `{v}`"
        out[name] = int(num)
    return out


def run(args: argparse.Namespace) -> int:
    from .extras import require

    require("onnx", command="validate")
    from policyc.onnxgate.report import render_json, render_text
    from policyc.onnxgate.validate import validate_model

    if not 0 <= args.tolerance < 10:
        print(f"policyc validate: error: --tolerance must be a fraction in [0, 10), got {args.tolerance}", file=sys.stderr)
        return EXIT_USAGE
    dims = _dims(args.dim or [])
    if isinstance(dims, str):
        print(f"policyc validate: error: {dims}", file=sys.stderr)
        return EXIT_USAGE
    if args.model == "-":
        import tempfile
        from pathlib import Path

        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "stdin.onnx"
            model.write_bytes(sys.stdin.buffer.read())
            report = validate_model(str(model), tolerance=args.tolerance, run=args.run, dims=dims)
    else:
        report = validate_model(args.model, tolerance=args.tolerance, run=args.run, dims=dims)
    print(render_json(report) if args.format == "json" else render_text(report))
    return EXIT_OK if report.ok else EXIT_GATE


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "validate", help="check an ONNX model's counted FLOPs against its embedded contract (CI gate)",
                    description=__doc__.split("\n\n")[0], codes=(Exit.OK, Exit.FAILED, Exit.USAGE),
                    examples=["policyc validate dist/model.onnx", "policyc validate dist/model.onnx --tolerance 0.15 --format json",
                              "policyc validate model.onnx --run --dim sequence=128"])
    p.add_argument("model", help="the ONNX model, with its contract embedded by `policyc embed` (`-`: stdin)")
    p.add_argument("--tolerance", type=float, default=0.15, help="allowed relative drift outside the declared interval (default 0.15)")
    p.add_argument("--run", action="store_true", help="also execute the model in onnxruntime (~100 tokens) and check the recount; small models only")
    p.add_argument("--dim", action="append", metavar="NAME=VALUE", help="pin a named dynamic input dim (default: batch dims 1, others the contract's tokens)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="output as text (default) or one JSON document")
    p.set_defaults(func=run)
