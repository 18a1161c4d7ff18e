"""The gateway's pool: the registered instances that have an endpoint, by model, best
score first. The engine picks the primary (only such instances are its candidates for a
gateway request); the pool answers "where does the retry go": the backup model's best
instance with an endpoint other than the primary's. Rebuilt only when the registry or the
policy state changes (a few instances among a fleet of thousands).
"""

from __future__ import annotations

from dataclasses import dataclass

from policyc.matcher import UnknownInstanceError
from policyc.server.engine import DecisionEngine


@dataclass(frozen=True, slots=True)
class Member:
    instance_id: str
    model: str
    endpoint: str
    gpu_key: str
    score: float
    protocol: str = "h2"  # how its endpoint speaks (its `endpoint_protocol` label): a retry stays on the primary's


class Pool:
    def __init__(self, engine: DecisionEngine) -> None:
        self._engine = engine
        self._seen: tuple[object, int] | None = None
        self._by_model: dict[str, tuple[Member, ...]] = {}
        self._endpoints: tuple[str, ...] = ()
        self._published: frozenset[str] | None = None
        self._version = 0  # bumped whenever the members or the published endpoints change
        self._protocols: dict[str, str] = {}  # endpoint -> how it speaks

    @property
    def published(self) -> frozenset[str] | None:
        """The endpoints the gateway's Envoy holds (None: not known, e.g. a user's own Envoy
        with a static pool): only those are picked, as primary or as fallback."""
        return self._published

    @published.setter
    def published(self, endpoints: frozenset[str] | None) -> None:
        self._published = endpoints
        self._version += 1

    def version(self) -> int:
        """Changes whenever what `fallbacks` answers may change (what a memo of it keys on)."""
        self._fresh()
        return self._version

    def _fresh(self) -> None:
        st, gen = self._engine.state, self._engine.generation
        if self._seen is not None and self._seen[0] is st and self._seen[1] == gen:
            return
        reg = st.registry
        members = []
        for inst in reg.routable():
            d = inst.deployment
            try:
                score = reg.score(inst.id)
            except UnknownInstanceError:  # removed since routable() was read
                continue
            members.append(Member(inst.id, inst.model, d.endpoint, f"{d.host}/{d.gpu}", score,
                                  inst.labels.get("endpoint_protocol", "h2")))
        members.sort(key=lambda m: (-m.score, m.instance_id))
        by_model: dict[str, list[Member]] = {}
        for m in members:
            by_model.setdefault(m.model, []).append(m)
        self._by_model = {k: tuple(v) for k, v in by_model.items()}
        self._protocols = {m.endpoint: m.protocol for m in members}
        self._endpoints = tuple(sorted({m.endpoint for m in members}))
        self._seen = (st, gen)
        self._version += 1

    def endpoints(self) -> tuple[str, ...]:
        """Every distinct endpoint of the pool (what Envoy's pool cluster must hold)."""
        self._fresh()
        return self._endpoints

    def members(self, model: str | None = None) -> tuple[Member, ...]:
        self._fresh()
        if model is None:
            return tuple(m for ms in self._by_model.values() for m in ms)
        return self._by_model.get(model, ())

    def fallbacks(self, model: str, avoid_endpoint: str, avoid_gpu: str, n: int = 1) -> tuple[Member, ...]:
        """Up to `n` instances of `model` for a retry: never the primary's endpoint, and
        another GPU than the primary's first (a GPU that stalled one request may stall the next).
        Only instances that speak the primary's protocol: Envoy chose the request's pool (HTTP/1.1
        or HTTP/2) once, for the primary, and the retry goes through the same pool, so a backup
        speaking the other protocol would fail the retry (an HTTP/1.1 vLLM never redirects into
        an HTTP/2 server, nor the other way)."""
        pub = self.published
        members = self.members(model)
        protocol = self._protocols.get(avoid_endpoint, "h2")
        cands = [m for m in members if m.endpoint != avoid_endpoint and (pub is None or m.endpoint in pub)
                 and m.protocol == protocol]
        cands.sort(key=lambda m: m.gpu_key == avoid_gpu)  # stable: best score first within each
        return tuple(cands[:n])
