"""Where a policyc cluster keeps what, under one prefix (default `/policyc/`).

    instances/<id>        an instance (JSON), held by the lease of what keeps it alive
    bundles/<sha256>      a bundle's canonical bytes, stored under its own hash
    bundle                the hash of the bundle in force (changed only by compare-and-swap)
    replicas/<name>       a replica's report (address, bundle it runs, applied revision), under its lease
    leader                the elected leader's name, under its lease; its create revision is the fencing token
    acts/<token>/<n>      each dangerous act the leader took, written in the fenced transaction
    sessions/<session>    session affinity: the instance a session stays on, and until when
    quarantines/<backend> a quarantine in force and its expiry
    anchors/<log id>      each replica's latest audit checkpoint (seq, hash), for auditors
    requests/<request id> what a registry write of that request id did (applied, or settled as
                          not applied), under a lease of an hour: retries and late copies read it
    attest/hosts/<host>   a host's enrolled attestation key (the operator's `policyc agent enroll`)
    attest/challenges/<host>/<tag>  a fresh nonce the control plane asks that host's agent to quote, under a short lease
    attest/quotes/<host>/<tag>      the agent's answer (quote, signature, PCR values), under the same lease
    attest/facts/<host>   the host's last attestation as verified (when, which key, which PCRs; or why refused)
    agents/<host>         a host agent's presence and discovered facts (interfaces, addresses), under its lease
    signals/<host>        what the host's agent measured in its last tick (timestamped), under its lease
    host_acts/<host>/<id> a self-heal step the leader sends to that host's agent, with its fencing token, under the leader's lease
    act_results/<host>/<id>  the agent's result of that step (outcome, duration, token), under the agent's lease
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PREFIX = "/policyc/"


@dataclass(frozen=True, slots=True)
class Keys:
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/") or not self.prefix.endswith("/"):
            raise ValueError(f"etcd prefix `{self.prefix}` must start and end with `/`")

    @property
    def instances(self) -> str:
        return self.prefix + "instances/"

    def instance(self, instance_id: str) -> str:
        return self.instances + instance_id

    @property
    def bundles(self) -> str:
        return self.prefix + "bundles/"

    def bundle_blob(self, content_hash: str) -> str:
        return self.bundles + content_hash

    @property
    def bundle(self) -> str:
        return self.prefix + "bundle"

    @property
    def replicas(self) -> str:
        return self.prefix + "replicas/"

    def replica(self, name: str) -> str:
        return self.replicas + name

    @property
    def leader(self) -> str:
        return self.prefix + "leader"

    def act(self, token: int, n: int) -> str:
        return f"{self.prefix}acts/{token:012d}/{n:06d}"

    @property
    def sessions(self) -> str:
        return self.prefix + "sessions/"

    def session(self, session: str) -> str:
        return self.sessions + session

    @property
    def quarantines(self) -> str:
        return self.prefix + "quarantines/"

    def quarantine(self, backend: str) -> str:
        return self.quarantines + backend

    @property
    def anchors(self) -> str:
        return self.prefix + "anchors/"

    def anchor(self, log_id: str) -> str:
        return self.anchors + log_id

    @property
    def requests(self) -> str:
        return self.prefix + "requests/"

    def request(self, request_id: str) -> str:
        return self.requests + request_id

    @property
    def enrolled_hosts(self) -> str:
        return self.prefix + "attest/hosts/"

    def enrolled_host(self, host: str) -> str:
        return self.enrolled_hosts + host

    def challenges(self, host: str) -> str:
        return self.prefix + "attest/challenges/" + host + "/"

    def challenge(self, host: str, tag: str) -> str:
        return self.challenges(host) + tag

    def quote_answer(self, host: str, tag: str) -> str:
        return self.prefix + "attest/quotes/" + host + "/" + tag

    @property
    def attest(self) -> str:
        return self.prefix + "attest/"

    @property
    def agents(self) -> str:
        return self.prefix + "agents/"

    def agent(self, host: str) -> str:
        return self.agents + host

    @property
    def attested_facts(self) -> str:
        return self.prefix + "attest/facts/"

    def attested_fact(self, host: str) -> str:
        return self.attested_facts + host

    @property
    def signals(self) -> str:
        return self.prefix + "signals/"

    def signal(self, host: str) -> str:
        return self.signals + host

    @property
    def host_acts(self) -> str:
        return self.prefix + "host_acts/"

    def host_act(self, host: str, act_id: str) -> str:
        return f"{self.host_acts}{host}/{act_id}"

    @property
    def act_results(self) -> str:
        return self.prefix + "act_results/"

    def act_result(self, host: str, act_id: str) -> str:
        return f"{self.act_results}{host}/{act_id}"

    def id_of(self, key: str, under: str) -> str:
        return key[len(under):]
