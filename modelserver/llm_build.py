"""Write a tiny Llama-architecture model and its tokenizer to a folder, with no hub.

This file runs INSIDE vLLM's own venv (`.venv-vllm`, where `torch`, `transformers` and
`tokenizers` live) as a plain script: it imports nothing of policyc, because policyc is not
installed there and vLLM's pins (torch, lark) must never meet policyc's environment.
`policyc.modelserver.llm_model.make_llm_model` runs it and then writes the model's
contract beside the weights.

    .venv-vllm/bin/python modelserver/llm_build.py OUT_DIR [--seed 0]

What it writes (the layout `save_pretrained` gives, which vLLM loads offline):
- `config.json`, `model.safetensors`, `generation_config.json`: `LlamaConfig(vocab_size=4096,
  hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
  num_key_value_heads=2, tie_word_embeddings=True)`, random weights (seeded), bf16. Its
  output is random text; its timing is real, which is what serving and routing need.
- `tokenizer.json`, `tokenizer_config.json`, `special_tokens_map.json`: a byte-level BPE
  (vocabulary 4096) trained on this interpreter's own standard library (a fixed, sorted list
  of files, so the same interpreter gives the same tokenizer), with `<|endoftext|>`,
  `<|im_start|>` and `<|im_end|>` (the end of a turn: eos) and a ChatML chat template.
- `build.json`: the shape, the seed, the parameter count and the FLOPs per token, for the
  contract writer.

Deterministic: `torch.manual_seed(seed)` before the weights; the BPE trainer is given the
same text in the same order.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 4096
CONTEXT = 1024
SHAPE = {"vocab_size": VOCAB, "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
             "max_position_embeddings": CONTEXT}
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TRAINING_BYTES = 6 * 1024 * 1024  # enough text for 4,096 merges; a few seconds to train

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def training_files() -> list[Path]:
    """The standard library's own `.py` files, sorted, up to TRAINING_BYTES: local text
    that every interpreter carries."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    out: list[Path] = []
    total = 0
    for p in sorted(lib.glob("*.py")):
        size = p.stat().st_size
        if total + size > TRAINING_BYTES:
            continue
        out.append(p)
        total += size
    if not out:
        raise SystemExit(f"llm_build: no .py files under {lib} to train a tokenizer on")
    return out


def build_tokenizer(out: Path):  # type: ignore[no-untyped-def]  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():  # type: ignore[no-untyped-def]
        for p in training_files():
            yield p.read_text(encoding="utf-8", errors="replace")

    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                   unk_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"], model_max_length=CONTEXT)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def build_model(out: Path, tok, seed: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    bos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = LlamaConfig(**SHAPE, bos_token_id=bos, eos_token_id=eos, pad_token_id=bos, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=bos).save_pretrained(str(out))
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    # A forward pass per token: 2 FLOPs per weight multiplied, the tied output projection included.
    per_layer_matmul = 2 * (cfg.hidden_size * cfg.hidden_size * 2  # q, o
                            + cfg.hidden_size * (cfg.hidden_size // cfg.num_attention_heads) * cfg.num_key_value_heads * 2  # k, v
                            + cfg.hidden_size * cfg.intermediate_size * 3)  # gate, up, down
    flops_per_token = per_layer_matmul * cfg.num_hidden_layers + 2 * cfg.hidden_size * cfg.vocab_size
    return {"parameters": params, "flops_per_token": flops_per_token, "bos_token_id": bos, "eos_token_id": eos}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="llm_build", description="write a tiny random Llama model and its BPE tokenizer")
    ap.add_argument("out", type=Path, help="the folder to write (created; existing files are overwritten)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(args.out)
    facts = build_model(args.out, tok, args.seed)
    facts.update(shape=SHAPE, seed=args.seed, context=CONTEXT, dtype="bfloat16",
                 tokenizer={"kind": "byte-level BPE", "vocab": len(tok), "specials": list(SPECIALS),
                            "training_files": len(training_files())},
                 python=sys.version.split()[0])
    (args.out / "build.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
