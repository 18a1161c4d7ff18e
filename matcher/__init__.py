"""matcher: the live instance registry and indexed contract matching.

Public API (for the decision service, the CLI and tests):
`Registry(bundle)` with add / add_many / add_batch (columns: `InstanceBatch`) / remove / update / set_score / set_scores (a batch, all or nothing) /
set_gpu_scores (the placer's per-GPU push) / swap_bundle, parse_request / match / matches (in the caller's form: bitmap, slots, ids, id set, objects) / admits (one
instance by id) / explain (a score belongs to a
(model, GPU) group: copies of a model on one GPU share it); `Request`, `RequestError`, `MatchResult`, `Explanation`;
`naive_match` (the reference scan the index must agree with).
"""

from __future__ import annotations

from .columns import InstanceBatch
from .errors import AdmissionError, RegistryError, RequestError, UnknownInstanceError, header_problem
from .instance import Deployment, Instance, admission_problems, attributes
from .naive import NaiveAnswer, naive_match
from .registry import Registry
from .request import Request
from .result import AllMatches, AppliedRule, Explanation, MatchResult, PredicateCount, RuleExplanation, Scored

__all__ = [
    "AdmissionError", "AllMatches", "InstanceBatch", "AppliedRule", "Deployment", "Explanation", "header_problem", "Instance", "MatchResult",
    "NaiveAnswer", "PredicateCount", "Registry", "RegistryError", "Request", "RequestError", "RuleExplanation",
    "Scored", "UnknownInstanceError", "admission_problems", "attributes", "naive_match",
]
