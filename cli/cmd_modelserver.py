"""`policyc modelserver`: serve ONNX models carrying their contracts with KServe over the
Open Inference Protocol (v2 gRPC and REST). Each `--model` is one instance with its own
gRPC port (its endpoint); the options after it, up to the next `--model`, are that
instance's. The process's REST port serves the model names one instance answers. See
`modelserver/command.py`.

`--engine vllm --model [NAME=]DIR --port P` serves an LLM folder (weights, tokenizer and its
`policyc.contract`; `policyc llm make-model DIR` makes one) with a real vLLM OpenAI server
from `.venv-vllm`, and with `--register` registers it with the decision service at its
endpoint; `--engine emulator` serves it with the vLLM-compatible emulator (same routes and
`vllm:*` metrics, a timing model). See `cli/llm_serving.py`.

Exit codes: 0 stopped by SIGTERM/SIGINT; 1 (vllm) the model's contract does not compile, or
vLLM did not start or died; 2 usage errors (no model, a misplaced option, a model file that
cannot be served, a port that cannot be bound); 6 / 7 (vllm --register) the decision service
could not be reached / refused the instance.
"""

from __future__ import annotations

import argparse


def register(sub) -> None:  # type: ignore[no-untyped-def]
    from policyc.modelserver.command import add_arguments

    from .exit_codes import Exit
    from .help import add_command

    p = add_command(sub, "modelserver", help="serve ONNX models with KServe over OIP v2 gRPC and REST, or an LLM with vLLM",
                    description=__doc__, codes=(Exit.OK, Exit.FAILED, Exit.USAGE, Exit.UNAVAILABLE, Exit.REFUSED),
                    examples=["policyc modelserver --model fraud-scorer.onnx --grpc-port 8081 --http-port 8080",
                              ("policyc modelserver --model lite.onnx --instance fraud-scorer-lite@host-02/gpu0 "
                               "--simplified lite-small.onnx --alias fraud-scorer --grpc-port 8082 --http-port 8080"
                               "   # a backup answering fraud-scorer's retries with its simplified variant"),
                              ("policyc modelserver --grpc-port 0 --http-port 0 --ready-file ready.json "
                               "--model a.onnx --instance a@host-01/gpu0 --model a.onnx --instance a@host-01/gpu1"
                               "   # two replicas, each its own port"),
                              ("policyc modelserver --engine vllm --model models/tiny-llama --port 8000 --register "
                               "--instance tiny-llama@host-01/gpu0 --deploy host=host-01 --deploy gpu=gpu0 "
                               "--deploy gpu_model=A100-80G --deploy region=us-west   # an LLM on vLLM, registered")])
    add_arguments(p)
    from . import llm_serving

    llm_serving.add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .extras import require

    require("llm" if args.engine in ("vllm", "emulator") else "modelserver", command=f"modelserver --engine {args.engine}")
    if args.engine in ("vllm", "emulator"):
        from . import llm_serving

        return llm_serving.run(args)
    from policyc.modelserver.command import run as serve

    return serve(args)
