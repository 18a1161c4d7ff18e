"""The emulator's engine: vLLM's scheduling, with time instead of a model.

Continuous batching in engine steps, as vLLM's V1 scheduler does it: each step runs every
running sequence's next token and up to `max_batched_tokens` of pending prefill (chunked);
a request waits while the KV cache has no room for its prompt; a decode that needs a block
the cache cannot give preempts the newest sequence (back to the queue front, its blocks
freed). A step lasts

    step_s + prefill_s_per_token x (prefill tokens in the step) + decode_s_per_seq x (sequences decoding)

(`TimingModel`, calibrated against real vLLM on this machine: `benchmarks/RESULTS.md`).
Full prompt blocks are hashed in chain (a block's hash covers every token before it) and
kept after their request ends, least recently used evicted first when the cache needs room:
a request whose leading blocks are cached skips their prefill (vLLM's automatic prefix
caching; its `prefix_cache_queries` / `_hits` count tokens).

Nothing here knows HTTP: `emulator.py` feeds requests in and streams their tokens out.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True, slots=True)
class TimingModel:
    """How long an engine step takes, and the engine's capacity."""

    # fitted to vLLM 0.32 (CPU) serving the tiny model on this machine (benchmarks/emulator_calibration.py)
    step_s: float = 1.75e-3  # a step's fixed cost (scheduling, sampling, the model's fixed layers)
    prefill_s_per_token: float = 6.2e-6
    decode_s_per_seq: float = 0.11e-3
    frontend_s: float = 1.5e-3  # the API server's own work per request (parse, tokenize), one request at a time
    max_num_seqs: int = 256
    max_batched_tokens: int = 2048  # prefill tokens per step (chunked prefill)
    block_size: int = 128
    kv_blocks: int = 16384  # vLLM's 1 GiB CPU cache for the tiny model: 16,384 blocks of 128 tokens
    max_model_len: int = 1024

    def __post_init__(self) -> None:
        for name in ("step_s", "prefill_s_per_token", "decode_s_per_seq", "frontend_s"):
            v = getattr(self, name)
            if not (v >= 0 and v < 10):
                raise ValueError(f"timing `{name}` {v!r}: seconds in [0, 10)")
        for name in ("max_num_seqs", "max_batched_tokens", "block_size", "kv_blocks", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"timing `{name}` must be at least 1")

    def step_time(self, prefill_tokens: int, decoding: int) -> float:
        return self.step_s + self.prefill_s_per_token * prefill_tokens + self.decode_s_per_seq * decoding


FinishCb = Callable[["Sequence"], None]


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    prompt: tuple[int, ...]
    max_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)  # token counts as they come, then None
    prefill_len: int = -1  # tokens to prefill: the prompt, or after a preemption the prompt and its output so far
    computed: int = 0  # of those, tokens whose KV exists (prefilled or found cached)
    generated: int = 0
    own: int = 0  # blocks it holds alone
    shared: list[bytes] = field(default_factory=list)  # cached prompt blocks it shares
    scheduled_at: float | None = None  # first admitted to the running batch (queue time ends)
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished: str | None = None  # "length" | "abort"
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prefill_len < 0:
            self.prefill_len = len(self.prompt)

    @property
    def length(self) -> int:
        return len(self.prompt) + self.generated


class Engine:
    """The scheduler loop and its figures (read by the metrics page).

    Blocks: `used` are held by one running sequence each; `pinned` are cached prompt blocks
    running sequences share (counted once); `cached` are kept prompt blocks nobody runs on,
    evicted least recently used first. Free = all - used - pinned - cached."""

    def __init__(self, timing: TimingModel, on_finish: FinishCb | None = None,
                 on_token: Callable[[Sequence, float], None] | None = None) -> None:
        self.timing = timing
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.used = 0
        self.pinned: dict[bytes, int] = {}
        self.cached: OrderedDict[bytes, None] = OrderedDict()
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self._wake = asyncio.Event()
        self._on_finish = on_finish
        self._on_token = on_token
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ figures
    @property
    def kv_usage(self) -> float:
        """Blocks running sequences hold over all blocks (kept, unused prompt blocks count as free, as in vLLM)."""
        return (self.used + len(self.pinned)) / self.timing.kv_blocks

    def _free(self) -> int:
        return self.timing.kv_blocks - self.used - len(self.pinned) - len(self.cached)

    # ------------------------------------------------------------------ requests
    def submit(self, seq: Sequence) -> None:
        """Queue a request; ValueError when it cannot fit the context."""
        if len(seq.prompt) + seq.max_tokens > self.timing.max_model_len:
            raise ValueError(f"{len(seq.prompt)} prompt tokens and max_tokens {seq.max_tokens} exceed the context "
                             f"of {self.timing.max_model_len}")
        self.waiting.append(seq)
        self._wake.set()

    def abort(self, seq: Sequence) -> None:
        """A client gone: the sequence stops generating and frees its blocks."""
        if seq.finished is not None:
            return
        if seq in self.waiting:
            self.waiting.remove(seq)
        if seq in self.running:
            self.running.remove(seq)
            self._release(seq)
        self._finish(seq, "abort")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # ------------------------------------------------------------------ blocks
    def _block_keys(self, tokens: tuple[int, ...]) -> list[bytes]:
        """Each full block's key, chained: a block's key covers every token before it."""
        keys = []
        h = hashlib.blake2b(digest_size=16)
        bs = self.timing.block_size
        for i in range(len(tokens) // bs):
            h.update(b"".join(t.to_bytes(4, "little") for t in tokens[i * bs:(i + 1) * bs]))
            keys.append(h.copy().digest())
        return keys

    def _take(self, n: int) -> bool:
        """n blocks for one sequence, evicting kept blocks LRU first; False when they are not there."""
        if n > self._free() + len(self.cached):
            return False
        while self._free() < n:
            self.cached.popitem(last=False)
        self.used += n
        return True

    def _admit(self, seq: Sequence) -> bool:
        """Blocks for what it must prefill and its next token; its cached leading prompt blocks shared."""
        bs = self.timing.block_size
        keys = self._block_keys(seq.prompt)
        hit = 0
        while hit < len(keys) and (keys[hit] in self.cached or keys[hit] in self.pinned):
            hit += 1
        need = -(-(seq.prefill_len + 1) // bs) - hit
        reusable = sum(1 for k in keys[:hit] if k in self.cached)  # leave the kept pool when shared
        if need > self._free() + len(self.cached) - reusable:
            return False
        for k in keys[:hit]:
            self.cached.pop(k, None)
            self.pinned[k] = self.pinned.get(k, 0) + 1
        self._take(need)
        seq.own, seq.shared = need, keys[:hit]
        seq.computed = min(hit * bs, seq.prefill_len - 1)  # the last token is always computed: it samples the next
        self.prefix_queries += seq.prefill_len
        self.prefix_hits += seq.computed
        seq.cached_tokens = max(seq.cached_tokens, seq.computed)
        return True

    def _release(self, seq: Sequence) -> None:
        """Its blocks back: shared ones unpinned (kept when nobody else runs on them), its own
        full prompt blocks kept for the next request with the same prefix, the rest free."""
        for k in seq.shared:
            left = self.pinned[k] - 1
            if left:
                self.pinned[k] = left
            else:
                del self.pinned[k]
                self.cached[k] = None
        self.used -= seq.own
        done = min(seq.computed, len(seq.prompt)) // self.timing.block_size
        for k in self._block_keys(seq.prompt)[len(seq.shared):done]:
            if k not in self.pinned:
                self.cached[k] = None
                self.cached.move_to_end(k)
        seq.own, seq.shared = 0, []

    def _finish(self, seq: Sequence, reason: str) -> None:
        seq.finished = reason
        seq.out.put_nowait(None)
        if self._on_finish is not None:
            self._on_finish(seq)

    # ------------------------------------------------------------------ the loop
    async def _loop(self) -> None:
        t = self.timing
        while True:
            if not self.waiting and not self.running:
                self._wake.clear()
                await self._wake.wait()
            while self.waiting and len(self.running) < t.max_num_seqs and self._admit(self.waiting[0]):
                admitted = self.waiting.popleft()
                if admitted.scheduled_at is None:
                    admitted.scheduled_at = time.monotonic()
                self.running.append(admitted)
            budget = t.max_batched_tokens
            prefill: list[tuple[Sequence, int]] = []
            decoding: list[Sequence] = []
            for s in self.running:
                left = s.prefill_len - s.computed
                if left > 0:
                    if budget > 0:
                        n = min(left, budget)
                        budget -= n
                        prefill.append((s, n))
                else:
                    decoding.append(s)
            await asyncio.sleep(t.step_time(sum(n for _, n in prefill), len(decoding)))
            now = time.monotonic()
            for s, n in prefill:
                if s.finished is None and s in self.running:
                    s.computed += n
                    self.prompt_tokens += n
                    if s.computed == s.prefill_len:
                        self._emit(s, now)  # the step that ends a prefill samples a token
            for s in decoding:
                if s.finished is None and s in self.running and self._grow(s):
                    self._emit(s, now)

    def _grow(self, s: Sequence) -> bool:
        """Room for its next token: a new block when its last is full; when none is left,
        the newest running sequence is preempted (recomputed later). False when `s` itself was."""
        if s.length % self.timing.block_size:
            return True
        while not self._take(1):
            victim = self.running.pop()
            self._release(victim)
            victim.prefill_len, victim.computed = victim.length, 0
            self.preemptions += 1
            self.waiting.appendleft(victim)
            if victim is s:
                return False
        s.own += 1
        return True

    def _emit(self, s: Sequence, now: float) -> None:
        s.generated += 1
        self.generation_tokens += 1
        if self._on_token is not None:
            self._on_token(s, now)  # before the times move: it reads the previous token's
        if s.first_token_at is None:
            s.first_token_at = now
        s.last_token_at = now
        s.out.put_nowait(s.generated)
        if s.generated >= s.max_tokens:
            self.running.remove(s)
            self._release(s)
            self._finish(s, "length")
