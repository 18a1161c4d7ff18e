"""The picker on its own (`placer/pick.py`): the best rank wins, unless a sticky key's
previous GPU is still feasible within the hysteresis margin, or a session stays next to its
state store; a rebalance forgets what lived on a host."""

from __future__ import annotations

import numpy as np
from placer_support import contract

from policyc.compiler.bundle import Session
from policyc.placer import SimulatedCluster
from policyc.placer.evaluate import Evaluation
from policyc.placer.evaluated import Evaluated
from policyc.placer.pick import Picker


def _ev(gpus: list[int], rank: list[float], fail: list[int] | None = None) -> Evaluated:
    n = len(gpus)
    z = np.zeros(n)
    return Evaluated.of_evaluation(Evaluation(
        gpus=np.array(gpus, dtype=np.int64), fail=np.array(fail or [-1] * n, dtype=np.int64), min_share=z + 0.1,
        port=np.zeros(n, dtype=np.int64), network=z, queueing=z, compute=np.array(rank), dependencies=z, sigma=z,
        rank=np.array(rank), raw_total=np.array(rank), dep_best=()))


def test_hysteresis_keeps_a_sticky_choice_within_its_margin_only() -> None:
    t = SimulatedCluster(seed=7, hosts=2, gpus_per_host=4, hosts_per_rack=2).topology()
    p = Picker(hysteresis=0.05, hysteresis_abs=2e-3)
    c = contract()
    assert p.choose(t, _ev([0, 1, 2], [0.030, 0.020, 0.040]), c, None, "k") == (1, None, None)
    choice, move, note = p.choose(t, _ev([0, 1, 2], [0.030, 0.0215, 0.020]), c, None, "k")
    assert (choice, move) == (1, None) and "kept" in str(note) and t.gpu_key(1) in str(note)  # 21.5 ms <= 20 x 1.05 + 2
    assert p.choose(t, _ev([0, 1, 2], [0.030, 0.030, 0.020]), c, None, "k")[0] == 2  # beyond the margin: moves
    assert p.choose(t, _ev([0, 1, 2], [0.030, 0.0205, 0.020], [-1, -1, 3]), c, None, "k") == (1, None, None)  # never kept infeasible


def test_a_session_stays_then_moves_near_its_store_and_a_rebalance_releases_it() -> None:
    t = SimulatedCluster(seed=7, hosts=2, gpus_per_host=4, hosts_per_rack=2).topology()
    p = Picker()
    c = contract(session=Session(state="remote"))
    first, _, why = p.choose(t, _ev([0, 5], [0.02, 0.01]), c, "s", "k")
    assert first == 1 and "starts on" in str(why) and p.session_gpu("s") == 5
    stay, move, why = p.choose(t, _ev([0, 5], [0.01, 0.02]), c, "s", "k")
    assert (stay, move) == (1, None) and "stays on" in str(why)
    same_host = [g for g in range(len(t.gpus)) if t.gpus[g].host == t.gpus[5].host and g != 5][0]
    other_host = [g for g in range(len(t.gpus)) if t.gpus[g].host != t.gpus[5].host][0]
    moved, move, why = p.choose(t, _ev([other_host, same_host, 5], [0.01, 0.02, 0.03], [-1, -1, 2]), c, "s", "k")
    assert moved == 1 and move is not None and move.from_gpu == t.gpu_key(5) and move.to_gpu == t.gpu_key(same_host)
    assert p.session_gpu("s") == same_host
    sessions, sticky = p.release_host(t, t.gpus[same_host].host)
    assert sessions == ("s",) and p.session_gpu("s") is None and sticky == 0
