"""The host agent starts its model server pinned where the placer's plan says (the plan's
`numa_node` and `cpus`), as the kernel then enforces it (`/proc/PID/status` of the server
and of each of its threads), measures it under its name, registers its instance while it
runs, and starts it again, pinned the same, when it crashes (the instance deregistered
meanwhile and registered again). A plan naming CPUs this host does not have is refused at start."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from policyc.cluster.host_acts import Order
from policyc.cluster.host_agent import HostAgent
from policyc.cluster.keys import Keys
from policyc.cluster.local_store import LocalStore
from policyc.cluster.server_pinning import Pin, PinError, cpu_list, cpuset_root, parse_cpu_list, read_affinity
from policyc.cluster.server_supervisor import ServerSpec
from policyc.matcher.instance import Instance
from policyc.modelserver.llm_model import cached_llm_model
from policyc.placer import PlacementPlan, Placer, Refresher, SimulatedCluster

HOST = "host-0001"


async def _until(cond, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)


def _plan(bundle) -> tuple[PlacementPlan, Instance]:  # type: ignore[no-untyped-def]
    """A real plan for a request on a topology whose NUMA node 0 has CPU 0 only (a CPU every
    machine has), and the instance it chose."""
    sim = SimulatedCluster(seed=3, hosts=2, gpus_per_host=2, numa_per_host=1, cpus_per_numa=1, hosts_per_rack=2)
    contract = bundle.contract("recommender")
    cands = [Instance(id=f"recommender@{s.host}/{s.gpu}", model="recommender", deployment=s.to_deployment())
             for s in sim.gpu_slots() if s.host == HOST]
    plan = Placer(Refresher(sim)).place(cands, 5.0, contract)
    assert isinstance(plan, PlacementPlan), plan
    assert Pin.of_gpu(sim.topology(), plan.host, plan.gpu) == Pin.of_plan(plan)  # what `"gpu"` in --servers resolves to
    return plan, next(i for i in cands if i.id == plan.instance_id)


async def _until_async(get, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while await get() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)


def _threads_affinity(pid: int) -> set[tuple[int, ...]]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out.add(parse_cpu_list(line.split(":", 1)[1]))
        except OSError:
            pass  # a thread that ended meanwhile
    return out


def test_the_agent_pins_its_model_server_where_the_plan_says_and_restarts_it_when_it_crashes(bundle, tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan, instance = _plan(bundle)
    assert plan.host == HOST and plan.cpus == (0,) and plan.numa_node == 0
    model = cached_llm_model().dir
    ready = tmp_path / "ready.json"
    spec = ServerSpec("emu-0", (sys.executable, "-m", "policyc.cli.main", "modelserver", "--engine", "emulator", "--model",
                                str(model), "--instance", plan.instance_id, "--ready-file", str(ready)), Pin.of_plan(plan),
                      instance=instance)
    pinned_memory = cpuset_root() is not None

    async def go() -> None:
        store = LocalStore(tmp_path / "state")
        await store.connect()
        keys = Keys()
        agent = HostAgent(store, keys, HOST, None, ttl=3, signal_period=0.2, servers=[spec], server_log_dir=tmp_path / "logs")
        await agent.start()
        try:
            assert agent.supervisor is not None
            await _until(ready.exists, 90, "the model server answering (its ready file)")
            first = agent.supervisor.pid("emu-0")
            assert first is not None and json.loads(ready.read_text())["pid"] == first
            cpus, mems = read_affinity(first)
            assert cpus == plan.cpus, f"Cpus_allowed_list {cpu_list(cpus)}, the plan names {cpu_list(plan.cpus)}"
            assert _threads_affinity(first) == {plan.cpus}  # every thread of the server, not its main one alone
            memory = agent.supervisor.status()["emu-0"]["memory"]
            if memory.startswith("cpuset.mems"):  # a cpuset cgroup this host let it join: memory on the plan's node
                assert mems == (plan.numa_node,) and f"cpuset.mems {plan.numa_node}" in memory
            else:  # said, never claimed
                assert pinned_memory is False or "did not join" in memory, memory

            signals: dict = {}  # the agent measures the server it started, under its name

            async def read_signals() -> bool:
                e = await store.get(keys.signal(HOST))
                if e is None:
                    return False
                signals.update(json.loads(e.value))
                return "rss_bytes" in signals.get("processes", {}).get("emu-0", {})
            deadline = time.monotonic() + 30
            while not await read_signals():
                assert time.monotonic() < deadline, f"the server's RSS in the agent's report: {signals}"
                await asyncio.sleep(0.1)

            key = keys.instance(instance.id)
            await _until_async(lambda: store.get(key), 20, "the server's instance registered by the agent")
            rev = (await store.read_prefix(key)).revision
            ready.unlink()
            os.kill(first, signal.SIGKILL)  # a crash
            await _until(lambda: agent.supervisor.pid("emu-0") not in (None, first) and ready.exists(), 90,
                         "the crashed model server started again")
            again = agent.supervisor.pid("emu-0")
            assert again is not None and read_affinity(again)[0] == plan.cpus and _threads_affinity(again) == {plan.cpus}
            st = agent.supervisor.status()["emu-0"]
            assert st["restarts"] == 1 and st["last_exit"] == -signal.SIGKILL
            kinds: list[str] = []  # deregistered while it was down, registered again once back

            async def changes() -> None:
                async for ch in store.watch(key, rev + 1):
                    kinds.append(ch.kind.name)
                    if kinds[-2:] == ["DELETE", "PUT"]:
                        return
            await asyncio.wait_for(changes(), 30)
            await _until(lambda: agent.ticker is not None and agent.ticker.collector.processes.get("emu-0") == again, 10,
                         "the collector measuring the new process")

            # the leader's `restart_server` act, under its fencing token: stopped and started again, pinned the same
            await store.put(keys.leader, b"r0")
            lead = await store.get(keys.leader)
            assert lead is not None
            order = Order("a1", HOST, "restart_server", "emu-0", False, lead.create_revision, "r0", "test", time.time())
            await store.put(keys.host_act(HOST, order.id), order.encode())
            answer: dict = {}

            async def answered() -> bool:
                e = await store.get(keys.act_result(HOST, order.id))
                answer.update(json.loads(e.value) if e is not None else {})
                return bool(answer)
            deadline = time.monotonic() + 60
            while not await answered():
                assert time.monotonic() < deadline, "no answer to the restart act"
                await asyncio.sleep(0.1)
            third = agent.supervisor.pid("emu-0")
            assert answer["outcome"] == "done" and f"pid {again} stopped, pid {third} started" in answer["detail"], answer
            assert third is not None and read_affinity(third)[0] == plan.cpus
            assert agent.supervisor.status()["emu-0"]["restarts"] == 1  # asked for: not counted as a crash
        finally:
            await agent.stop()
            await store.close()
        assert agent.supervisor.pid("emu-0") is None

    asyncio.run(go())


def test_a_plan_naming_cpus_this_host_lacks_is_refused_at_start(tmp_path) -> None:
    bad = Pin(0, (4095,))

    async def go() -> None:
        store = LocalStore(tmp_path / "state")
        await store.connect()
        agent = HostAgent(store, Keys(), HOST, None, signal_period=None, discover_facts=False,
                          servers=[ServerSpec("x", ("sleep", "30"), bad)])
        try:
            with pytest.raises(PinError, match="CPUs 4095 .* refused, not narrowed"):
                await agent.start()
        finally:
            await store.close()
    asyncio.run(go())
