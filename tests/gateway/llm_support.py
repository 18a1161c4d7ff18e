"""A small real tokenizer for the LLM tests: a byte-level BPE trained (in ~0.1 s) on this
package's own gateway sources and saved as `tokenizer.json`, the file a served model ships."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def make_tokenizer(folder: Path, vocab: int = 512) -> Path:
    """Train a tokenizer, save it as `folder/tokenizer.json`, return that path."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    sources = Path(__file__).resolve().parents[2] / "gateway"
    tok.train_from_iterator((p.read_text() for p in sorted(sources.glob("*.py"))), trainer)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "tokenizer.json"
    tok.save(str(out))
    return out
