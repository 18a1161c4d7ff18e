"""Audit across replicas: each replica keeps its own chain and anchors its checkpoints in
etcd; `policyc audit verify` takes every replica's log and fails when one was cut after
its anchor, or was not handed over at all."""

from __future__ import annotations

import sqlite3

from cluster_rig import eventually, new_prefix, replica, stub

from policyc.cli.main import main
from policyc.server.fleet import admissible_fleet
from policyc.server.proto import pb


def test_every_replicas_log_verifies_against_its_anchor_and_a_cut_log_is_named(bundle, etcd, tmp_path, capsys) -> None:
    prefix = new_prefix()
    logs = [tmp_path / f"audit-{i}.db" for i in range(2)]
    reps = [replica(bundle, etcd, f"a{i}", prefix, audit_log=logs[i]) for i in range(2)]
    try:
        fleet = admissible_fleet(bundle, reps[0].server.cluster.gpu_slots(), models=["fraud-scorer"])
        reps[0].server.engine.register_many(fleet[:2])
        for th in reps:
            eventually(lambda th=th: len(th.server.state.registry) == 2, 5)
            ch, s = stub(th)
            with ch:
                for _ in range(40):
                    s.Decide(pb.DecideRequest(headers={"X-Model": "fraud-scorer"}))
            th.server.audit.flush()
            th.server.audit.log.checkpoint()
        anchored = {}
        for th, log in zip(reps, logs):
            from policyc.cluster.anchors import latest_checkpoint

            eventually(lambda log=log: (latest_checkpoint(log)[1] or None) is not None and latest_checkpoint(log)[1].seq > 30, 10)
            eventually(lambda th=th: th.server.replica.anchored_seq > 30, 10)
            anchored[log] = th.server.replica.anchored_seq
    finally:
        for th in reps:
            th.stop()
    argv = ["audit", "verify", "--etcd", *etcd.endpoints, "--etcd-prefix", prefix]
    assert main([*argv, "--log", str(logs[0]), "--log", str(logs[1])]) == 0
    assert "all logs verify" in capsys.readouterr().out

    assert main([*argv, "--log", str(logs[1])]) == 1  # a replica's log withheld
    assert "replica a0's log" in capsys.readouterr().out

    # cut replica a0's log before its anchor, with the checkpoints that would betray it
    cut = anchored[logs[0]] - 10
    with sqlite3.connect(logs[0]) as db:
        for trig in [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='trigger'")]:
            db.execute(f'DROP TRIGGER "{trig}"')
        db.execute("DELETE FROM entries WHERE seq > ?", (cut,))
        db.execute("DELETE FROM checkpoints WHERE seq > ?", (cut,))
    assert main([*argv, "--log", str(logs[0]), "--log", str(logs[1])]) == 1
    out = capsys.readouterr().out
    assert "verification FAILED" in out and "(truncated)" in out and "anchor checkpoint covers entries up to" in out
