"""`policyc llm make-model DIR`: make the project's tiny LLM locally, no hub — a Llama-architecture
model (2 layers, width 128, vocabulary 4096, random seeded weights, bf16), a byte-level BPE
trained on Python's own standard library with a ChatML chat template, and its contract
(`DIR/policyc.contract`). vLLM serves the folder: `policyc modelserver --engine vllm --model DIR`.

It runs in vLLM's own venv (`.venv-vllm`, made by `scripts/setup.sh`; `$POLICYC_VLLM_VENV`
names another). Exit codes: 0 made; 1 the build failed (its output is shown); 2 usage
(vLLM's venv is missing, DIR is a file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .exit_codes import Exit
from .help import add_command


def register(sub: argparse._SubParsersAction) -> None:
    codes = (Exit.OK, Exit.FAILED, Exit.USAGE)
    p = add_command(sub, "llm", help="LLM helpers: make the project's tiny model for vLLM", description=__doc__, codes=codes,
                    examples=["policyc llm make-model models/tiny-llama",
                              "policyc modelserver --engine vllm --model models/tiny-llama --port 8000"])
    lsub = p.add_subparsers(dest="llm_command", metavar="ACTION", parser_class=type(p))
    m = add_command(lsub, "make-model", help="write a tiny random Llama model, its tokenizer and its contract to DIR",
                    description=__doc__, codes=codes, examples=["policyc llm make-model models/tiny-llama --seed 0"])
    m.add_argument("dir", type=Path, metavar="DIR", help="the model folder to write (created)")
    m.add_argument("--name", default="tiny-llama", help="the model's (and its contract's) name (default tiny-llama)")
    m.add_argument("--seed", type=int, default=0, help="the weights' seed (default 0)")
    m.set_defaults(func=_make)

    def no_action(args: argparse.Namespace) -> int:
        p.print_help()
        return Exit.USAGE

    p.set_defaults(func=no_action)


def _make(args: argparse.Namespace) -> int:
    import re

    from policyc.modelserver.llm_model import LlmModelError, make_llm_model, vllm_python

    if not re.fullmatch(r"[a-z][a-z0-9-]{0,62}", args.name):
        print(f"policyc llm make-model: error: --name `{args.name}`: lower-case letters, digits and `-`, "
              "starting with a letter (it is the contract's name)", file=sys.stderr)
        return Exit.USAGE
    if args.dir.exists() and not args.dir.is_dir():
        print(f"policyc llm make-model: error: {args.dir}: exists and is not a folder", file=sys.stderr)
        return Exit.USAGE
    try:
        vllm_python()
    except LlmModelError as e:
        print(f"policyc llm make-model: error: {e}", file=sys.stderr)
        return Exit.USAGE
    try:
        model = make_llm_model(args.dir, name=args.name, seed=args.seed)
    except LlmModelError as e:
        print(f"policyc llm make-model: error: {e}", file=sys.stderr)
        return Exit.FAILED
    facts = model.facts
    print(f"made {model.name} in {model.dir}: {facts['parameters']:,} parameters, {facts['flops_per_token']:,} FLOPs "
          f"per token, context {facts['context']}; contract {model.contract_path}")
    return Exit.OK
