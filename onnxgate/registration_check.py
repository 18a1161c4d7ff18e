"""The gate at registration: a model is recounted when an instance registers with it.

Why here and not only in CI: the seed's drift case (a model upgraded from 1.2e12 to 1.8e12
FLOPs that kept its old contract) passes every check that compares contracts with
contracts. Only counting the model that is actually served catches it, so the decision
service recounts the ONNX model an instance registers with (`RegisterInstance(onnx_model=…)`
carries the whole file, so the service has what it needs and no model server can skip the
check by registering from elsewhere) at the contract's token count, and refuses a count
outside the declared interval widened by the gate's tolerance, with `policyc validate`'s own
message.

A count costs shape inference of the graph (tenths of a second for the demo's models), so
verdicts are kept per model file (its SHA-256): a fleet registering many instances of one
file, or an instance re-registering after a restart, counts it once. The cache is bounded.

LLM models are served from a folder (vLLM's `config.json`, weights, tokenizer), not an ONNX
file; `check_llm_config` checks a contract's `llm` block against that folder's config the
same way (see `llm_config_check`).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .validate import DEFAULT_TOLERANCE, ValidationReport, Verdict, validate_model

CACHE_SIZE = 256  # distinct model files whose verdicts are kept


@dataclass(frozen=True, slots=True)
class Recount:
    """A registration's recount: the gate's report and the file's digest."""

    sha256: str
    report: ValidationReport
    cached: bool

    @property
    def ok(self) -> bool:
        return self.report.ok


class RecountCache:
    """Verdicts of `validate_model` per (model file digest, tolerance), least recently used out."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, float], ValidationReport] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = 0  # how many recounts were done (not served from the cache)

    def recount(self, data: bytes, *, tolerance: float = DEFAULT_TOLERANCE) -> Recount:
        """The gate's verdict on the model `data` against its embedded contract."""
        digest = hashlib.sha256(data).hexdigest()
        key = (digest, tolerance)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return Recount(digest, hit, True)
        report = validate_model(data, tolerance=tolerance)
        if report.verdict in (Verdict.BAD_MODEL, Verdict.BAD_CONTRACT):
            return Recount(digest, report, False)  # not kept: the caller refuses these by their own path
        with self._lock:
            self.counts += 1
            self._items[key] = report
            while len(self._items) > self._size:
                self._items.popitem(last=False)
        return Recount(digest, report, False)


_CACHE = RecountCache()


def recount_model(data: bytes, *, tolerance: float = DEFAULT_TOLERANCE) -> Recount:
    """The process-wide cached recount (see `RecountCache.recount`)."""
    return _CACHE.recount(data, tolerance=tolerance)


def recount_cache() -> RecountCache:
    return _CACHE
