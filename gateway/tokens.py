"""An LLM prompt's tokens, counted with the served model's own tokenizer.

A request's cost is its prompt: the picker counts it with the `tokenizers` library, from the
`tokenizer.json` the model ships (the file vLLM, SGLang and `transformers` read), loaded
once per model and kept. Where no tokenizer is registered for a model the count is a
declared estimate (`ESTIMATE_BYTES_PER_TOKEN` bytes of UTF-8 a token, the usual figure for
byte-level BPE on English text and code), and says so: `TokenCount.counted` is False.

Chat requests: each message's role and text are counted by the tokenizer; the chat
template's framing around them (ChatML: `<|im_start|>`, the role's line break,
`<|im_end|>` and a line break a message, and the assistant's opening) is the declared
`CHAT_FRAME_TOKENS` a message plus `CHAT_REPLY_TOKENS`, since rendering a model's Jinja
template is the model server's job; the count the server reports back (`usage`) is what
the audit keeps as measured.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:  # the library is imported where a tokenizer is loaded: a gateway without it counts by estimate
    from tokenizers import Tokenizer

ESTIMATE_BYTES_PER_TOKEN = 4.0
CHAT_FRAME_TOKENS = 3  # ChatML: <|im_start|> and the role's line break before, <|im_end|> after
CHAT_REPLY_TOKENS = 3  # the assistant's opening line the template adds for the reply
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json larger than this is refused, not loaded
CACHE_MIN_CHARS = 4096  # texts at least this long have their count kept
CACHE_ENTRIES = 4096


class TokenizerError(ValueError):
    """A registered tokenizer that cannot be loaded (missing, too large, not a tokenizer)."""


@dataclass(frozen=True, slots=True)
class TokenCount:
    tokens: int
    counted: bool  # True: the model's tokenizer counted them; False: the declared estimate
    how: str  # for people and the audit: which tokenizer, or the estimate's rule


def tokenizer_file(path: Path) -> Path:
    """`path` itself when it is a file, else `path/tokenizer.json` (a model folder)."""
    return path if path.is_file() else path / "tokenizer.json"


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in `path` (a `tokenizer.json` or the model folder holding one)."""
    f = tokenizer_file(path)
    try:
        size = f.stat().st_size
    except OSError as e:
        raise TokenizerError(f"tokenizer `{f}`: {e.strerror or e}") from None
    if size > MAX_TOKENIZER_BYTES:
        raise TokenizerError(f"tokenizer `{f}`: {size} bytes, more than {MAX_TOKENIZER_BYTES}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerError(f"tokenizer `{f}`: the `tokenizers` library is not installed "
                             "(pip install 'policyc[llm]')") from None
    try:
        return Tokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 - the library raises its own exception kinds for a bad file
        raise TokenizerError(f"tokenizer `{f}` cannot be loaded: {e}") from None


def longest_token_bytes(tok: Tokenizer) -> int:
    """The most UTF-8 bytes one token of `tok` stands for: a prompt of B bytes is at least
    B / this many tokens, so one far over a context is refused without tokenizing it."""
    longest = 1
    for i in range(tok.get_vocab_size()):
        text = tok.decode([i], skip_special_tokens=False)
        longest = max(longest, len(text.encode("utf-8", "surrogatepass")))
    return longest


class Tokenizers:
    """Model name -> its tokenizer, each loaded on first use and kept (thread-safe: the picker
    counts on its event loop or in a worker thread, the benchmark from threads)."""

    def __init__(self, paths: Mapping[str, Path] | None = None) -> None:
        self._paths: dict[str, Path] = dict(paths or {})
        self._loaded: dict[str, Tokenizer] = {}
        self._longest: dict[str, int] = {}
        self._counts: collections.OrderedDict[tuple[str, bool, int, int], int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def at_least(self, model: str, size: int) -> int:
        """A lower bound on the tokens of `size` bytes of prompt text (its bytes divided by
        the longest token's; without a tokenizer, the declared estimate's bytes a token)."""
        tok = self.tokenizer(model)
        if tok is None:
            return int(size // ESTIMATE_BYTES_PER_TOKEN)
        longest = self._longest.get(model)
        if longest is None:
            longest = self._longest[model] = longest_token_bytes(tok)
        return size // longest

    def register(self, model: str, path: Path, *, load_now: bool = True) -> None:
        """Count `model`'s prompts with the tokenizer in `path` (loaded now unless told not
        to, so a bad file is refused when registered, not on a request)."""
        with self._lock:
            self._paths[model] = path
            self._loaded.pop(model, None)
            self._longest.pop(model, None)
        if load_now:
            self.tokenizer(model)

    def models(self) -> tuple[str, ...]:
        return tuple(sorted(self._paths))

    def tokenizer(self, model: str) -> Tokenizer | None:
        tok = self._loaded.get(model)
        if tok is not None:
            return tok
        path = self._paths.get(model)
        if path is None:
            return None
        tok = load_tokenizer(path)
        with self._lock:
            self._loaded[model] = tok
        return tok

    def count_text(self, model: str, texts: Iterable[str]) -> TokenCount:
        """The tokens of a completion prompt (its strings, as the server tokenizes each)."""
        texts = list(texts)
        tok = self.tokenizer(model)
        if tok is None:
            return _estimate(texts, 0)
        n = self._counted(model, tok, texts, True)
        return TokenCount(n, True, f"{model}'s tokenizer")

    def count_chat(self, model: str, messages: Iterable[tuple[str, str]]) -> TokenCount:
        """The tokens of a chat prompt: (role, text) pairs, with the template's framing."""
        pairs = list(messages)
        framing = CHAT_FRAME_TOKENS * len(pairs) + CHAT_REPLY_TOKENS
        tok = self.tokenizer(model)
        if tok is None:
            return _estimate([f"{r}\n{t}" for r, t in pairs], framing)
        texts = [f"{r}\n{t}" for r, t in pairs]
        n = self._counted(model, tok, texts, False)
        return TokenCount(n + framing, True, f"{model}'s tokenizer, {framing} template tokens declared")

    def _counted(self, model: str, tok: Tokenizer, texts: list[str], special: bool) -> int:
        """The tokens of `texts`, each long one's count kept (bounded, least recently used out):
        a conversation resends its history and a system prompt repeats, so a long text is
        tokenized once. Keyed by the text's own hash (keyed SipHash: a client cannot aim a
        collision) and length."""
        cache = self._counts
        total, todo = 0, []
        for t in texts:
            if len(t) < CACHE_MIN_CHARS:
                todo.append(t)
                continue
            key = (model, special, len(t), hash(t))
            with self._lock:
                n = cache.get(key)
                if n is not None:
                    cache.move_to_end(key)
            if n is None:
                todo.append(t)
            else:
                total += n
        if todo:
            counts = [len(e.ids) for e in tok.encode_batch(todo, add_special_tokens=special)]
            total += sum(counts)
            with self._lock:
                for t, n in zip(todo, counts):
                    if len(t) >= CACHE_MIN_CHARS:
                        cache[(model, special, len(t), hash(t))] = n
                        if len(cache) > CACHE_ENTRIES:
                            cache.popitem(last=False)
        return total


def _estimate(texts: list[str], extra: int) -> TokenCount:
    size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    n = int(-(-size // ESTIMATE_BYTES_PER_TOKEN)) + extra
    return TokenCount(n, False, f"estimated: {ESTIMATE_BYTES_PER_TOKEN:g} bytes a token (no tokenizer registered)")
