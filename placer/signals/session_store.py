"""Session store: a contract whose session state must sit on the GPU's own NUMA node
(`colocate = same_numa`) refuses a GPU whose NUMA node has another kind of store."""

from __future__ import annotations

import numpy as np

from ..framework import Column, ContractInputs, NOTHING, Signal, Stage, Words
from ..plan import Constraint


class SessionStore(Signal[ContractInputs]):
    name = "session_store"
    constraint = Constraint.SESSION_STORE
    consumes = ()  # structure only
    stage = Stage.CONTRACT

    def reference(self, x: ContractInputs) -> Column:
        sess = x.contract.session
        if sess is None or sess.state == "remote" or sess.colocate != "same_numa":
            return NOTHING
        t = x.topology
        stores = np.array([t.numa[t.gpus[i].numa].store.value for i in np.arange(len(t.gpus))[x.gpus].tolist()])
        return Column(fail=stores != sess.state)

    def column(self, x: ContractInputs) -> Column:
        sess = x.contract.session
        if sess is None or sess.state == "remote" or sess.colocate != "same_numa":
            return NOTHING
        return Column(fail=x.topology.gpu_store[x.gpus] != sess.state)

    def detail(self, w: Words, r: int) -> str:
        t = w.snap.topology
        g = int(w.ev.gpus[r])
        return f"NUMA node has a `{t.numa[t.gpus[g].numa].store.value}` session store, the contract needs it colocated"
