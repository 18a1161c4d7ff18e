"""Decision ids are unique, 32 hex characters, and a forked child never repeats its parent's."""

from __future__ import annotations

import os

from policyc.server.decision_ids import new_decision_id


def test_ids_are_unique_hex_of_fixed_length() -> None:
    ids = [new_decision_id() for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    assert len({i[:16] for i in ids}) == 1  # one process prefix, a counter after it


def test_a_forked_child_draws_its_own_prefix() -> None:
    parent = new_decision_id()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report one id and leave at once
        os.write(w, new_decision_id().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 64).decode()
    os.close(r)
    os.waitpid(pid, 0)
    assert len(child) == 32 and child[:16] != parent[:16]
