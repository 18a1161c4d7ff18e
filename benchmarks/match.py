"""Matcher benchmark: 100,000 instances, 1,000 mixed requests, against a naive scan and
Cedar (cedarpy) in the same run; then the same at fleet scale (`--fleet realistic`).

Request kinds: selective (model + region + finance tenant: TPM, memory encryption,
firewall), broad (SLO only, most of the fleet matches), empty (a healthcare tenant pinned
to a US region: nothing matches), compliance-heavy (finance / healthcare tenant with an
SLO, no model). Reports p50/p99 per kind for `match(request, k=1)` on parsed requests and
for parse + match, index build time, add / remove / set_score cost, score pushes (512
updates one by one vs `set_scores` in chunks of 64), memory, the Bloom
filters' false-positive and skip rates, and the ratio to a naive scan and to Cedar
evaluating every candidate instance (a batch of one Cedar request per instance).

The request mix repeats request shapes, as real traffic does, so most requests reuse a
cached plan and its candidates (`matcher/plan.py`). Two more passes show what that cache
is worth and what is left without it: "churn" (one instance removed and re-added before
every request, untimed, so every request recomputes its candidates from its plan) and
"cold" (the plan cache off: every request is planned and intersected from scratch).

The fleet-scale part (`tests/fleet_shapes.py`): 100,000 instances of 50 model families in 8
regions on 4 GPU architectures, an SLO per deployment (about 22,000 contracts), requests of
four kinds (selective, compliance, regional, broad) with SLOs to the hundredth of a
millisecond, so most raw shapes are new. It reports the registry build, the bases prebuilt
after it (`matcher/base_catalog.py`: their thread's CPU, wall time and memory; both parts
wait for it before timing anything), best candidate
(k = 1) p50/p99 per kind for requests never seen before (after a warm-up on other new
requests, as a running service is), how many of them were new raw shapes and how many hit
a plan of their reduced shape, `Registry.matches` against a plain list comprehension over
the same fleet in the same run (both checked equal to each other, and a sample to the naive
scan), add / remove / set_score at that size.

    .venv/bin/python benchmarks/match.py            # both parts, ~2-3 minutes
    .venv/bin/python benchmarks/match.py --quick    # fewer baseline samples
    .venv/bin/python benchmarks/match.py --fleet realistic   # the fleet-scale part only
    .venv/bin/python benchmarks/match.py --fleet realistic --admits-only --instances 1000000   # setup and admits alone
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

from policyc.compiler.pipeline import compile_paths
from policyc.matcher import Deployment, Instance, InstanceBatch, Registry, naive_match
from policyc.matcher.admission_cache import SIGNATURE_FIELDS, AdmissionCache

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the fleet generator the property tests use too

import fleet_shapes  # noqa: E402
KINDS = ("selective", "broad", "empty", "compliance")
GPUS = {"ampere": ("A100-80G", "A100-40G"), "hopper": ("H100", "H200"), "ada": ("L40S", "L4")}

CEDAR_POLICIES = """
permit(principal, action, resource);
forbid(principal, action, resource) when { context has model && resource.model != context.model };
forbid(principal, action, resource) when { context has slo_us && resource.slo_us > context.slo_us };
forbid(principal, action, resource) when { context has region && resource.region != context.region };
forbid(principal, action, resource) when { context.tenant_class == "finance" &&
  !(resource.tpm && resource.memory_encryption && resource.hardware_firewall) };
forbid(principal, action, resource) when { context.tenant_class == "healthcare" &&
  !(["eu-west", "eu-central"].contains(resource.region) && (resource.tee || resource.memory_encryption)) };
forbid(principal, action, resource) when { ["public", "retail"].contains(context.tenant_class) &&
  resource has data && resource.data == "phi" };
"""


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def warm(reg: Registry, rss_before: float) -> str:
    """Wait for the registry's bases to be prebuilt (`matcher/base_catalog.py`: a thread
    after the build) before anything is timed; what that cost."""
    t = time.perf_counter()
    done = reg.warm(120)
    waited = time.perf_counter() - t
    gc.collect()
    p = reg.prebuilt
    return (f"bases prebuilt after the build: {p.built:,} of {p.listed:,} listed ({'done' if done and p.done else 'NOT done'}), "
            f"{p.cpu_s:.2f} s CPU on its thread, {p.wall_s:.2f} s wall (waited {waited:.2f} s after the build), "
            f"+{rss_mb() - rss_before:.0f} MB RSS; bases kept by what they answer: {len(reg.index.effective):,}")


def fleet(bundle, n: int, rng: random.Random) -> list[Instance]:
    """Instances registered host by host: each host runs one model in one region, as a
    real fleet's rollout does; security flags vary by host."""
    out: list[Instance] = []
    contracts = list(bundle.contracts)
    host = 0
    while len(out) < n:
        c = rng.choice(contracts)
        arches = c.gpu_arch or tuple(GPUS)
        gpus = [g for a in arches for g in GPUS[a] if (gc_ := bundle.gpu(g)) and gc_.hbm_bandwidth >= c.memory.bandwidth_min]
        region = rng.choice(c.regions or ("us-west", "us-east", "eu-west", "eu-central"))
        sec = {a: (a in c.security) or rng.random() < 0.4 for a in ("tpm", "memory_encryption", "hardware_firewall", "tee")}
        gpu_model = rng.choice(gpus)
        state = c.session.state if c.session else "remote"
        for g in range(min(8, n - len(out))):
            d = Deployment(host=f"host{host:05d}", gpu=f"gpu{g}", gpu_model=gpu_model, region=region, numa_node=g // 4,
                           session_state=state, cuda="12.4", **sec)
            out.append(Instance(id=f"{c.name}-{host:05d}-{g}", model=c.name, deployment=d,
                                labels={"rack": f"r{host % 40}"}))
        host += 1
    return out


def requests(bundle, n: int, rng: random.Random) -> list[tuple[str, dict[str, str]]]:
    models = [c.name for c in bundle.contracts]
    out = []
    for i in range(n):
        kind = KINDS[i % 4]
        if kind == "selective":
            h = {"X-Model": rng.choice(["fraud-scorer", "fraud-scorer-lite"]), "X-Data-Region": rng.choice(["us-west", "us-east"]),
                 "X-Tenant": rng.choice(["acme-bank", "first-federal"])}
        elif kind == "broad":
            h = {"X-SLO-Latency": rng.choice(["2s", "2.5 s", "3000ms"])}
        elif kind == "empty":
            h = {"X-Tenant": rng.choice(["st-marys", "charite"]), "X-Data-Region": rng.choice(["us-west", "us-east"]),
                 "X-Model": rng.choice(models)}
        else:
            h = {"X-Tenant": rng.choice(["acme-bank", "st-marys", "charite", "first-federal"]),
                 "X-SLO-Latency": rng.choice(["200ms", "1.5s", "2s"])}
        out.append((kind, h))
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def cedar_entities(entries) -> list[dict]:
    ents = []
    for inst, attrs, _ in entries:
        a = {"model": attrs["model"], "region": attrs["region"], "tpm": attrs["tpm"],
             "memory_encryption": attrs["memory_encryption"], "hardware_firewall": attrs["hardware_firewall"],
             "tee": attrs["tee"], "slo_us": int(round(attrs["slo_latency"] * 1e6))}
        if "labels.data" in attrs:
            a["data"] = attrs["labels.data"]
        ents.append({"uid": {"type": "Instance", "id": inst.id}, "attrs": a, "parents": []})
    ents.append({"uid": {"type": "Client", "id": "c"}, "attrs": {}, "parents": []})
    return ents


def cedar_context(vars) -> dict:
    ctx = {}
    for k in ("model", "region", "tenant_class"):
        if k in vars:
            ctx[k] = vars[k]
    if "slo" in vars:
        ctx["slo_us"] = int(round(vars["slo"] * 1e6))
    ctx.setdefault("tenant_class", "none")
    return ctx


def score_pushes(reg: Registry, insts: list[Instance], rng: random.Random, rounds: int = 10,
                 push: int = 512, chunk: int = 64) -> None:
    """What the decision server's score push costs per group move: `push` updates of
    random instances to random scores (this fleet runs one instance per GPU, so a pushed GPU
    is one (model, GPU) group of one instance), as one-by-one `set_score` (the baseline) and
    as `set_scores` in chunks of `chunk` (as the engine's `push_scores` batches one chunk per
    event-loop callback). Each round times both on fresh updates, in alternating order;
    medians over the rounds."""
    pc = time.perf_counter_ns
    one: list[float] = []
    batched: list[float] = []
    for r in range(rounds):
        for batch_first in ((True, False) if r % 2 else (False, True)):
            updates = [(inst.id, rng.random()) for inst in rng.sample(insts, push)]
            gc.disable()
            t = pc()
            if batch_first:
                for c in range(0, push, chunk):
                    reg.set_scores(updates[c:c + chunk])
                batched.append((pc() - t) / 1e3 / push)
            else:
                for iid, score in updates:
                    reg.set_score(iid, score)
                one.append((pc() - t) / 1e3 / push)
            gc.enable()
    o, b = statistics.median(one), statistics.median(batched)
    print(f"score push ({push} updates, {rounds} rounds), µs per group move: one by one (set_score) {o:.2f} "
          f"[{min(one):.2f}-{max(one):.2f}]; set_scores in chunks of {chunk} {b:.2f} [{min(batched):.2f}-{max(batched):.2f}]; "
          f"batched / one-by-one {b / o:.2f} ({o / b:.2f}× cheaper)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer naive-scan and Cedar samples")
    ap.add_argument("--instances", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--per-kind", type=int, default=0, help="requests of each kind timed in every answer form")
    ap.add_argument("--store", action="store_true", help="also time the load from store records above 200,000 instances")
    ap.add_argument("--fleet", choices=("five", "realistic", "both"), default="both",
                    help="today's five-contract fleet, the fleet-scale one, or both")
    ap.add_argument("--admits-only", action="store_true",
                    help="the fleet-scale part's setup and the check by id (Registry.admits) alone, against the naive check")
    args = ap.parse_args()
    if args.fleet != "realistic":
        five_contracts(args)
    if args.fleet != "five":
        fleet_scale(args)


def comprehension(kind: str, v: dict, as_set: bool = False):  # type: ignore[no-untyped-def]
    """The plain Python baseline for all matches: the request's conditions written inline
    over (id, attributes) pairs, giving the ids as a list (or a set)."""
    slo = v["slo"]
    if kind == "selective":
        fam, reg = v["family"], v["region"]
        if as_set:
            return lambda pairs: {i for i, a in pairs if a["slo_latency"] <= slo and a["labels.family"] == fam
                                  and a["region"] == reg and a["tpm"]}
        return lambda pairs: [i for i, a in pairs if a["slo_latency"] <= slo and a["labels.family"] == fam
                              and a["region"] == reg and a["tpm"]]
    if kind == "compliance":
        reg, arch = v["region"], v["arch"]
        tpm, enc, fw = v.get("need_tpm", False), v.get("need_encryption", False), v.get("need_firewall", False)
        if as_set:
            return lambda pairs: {i for i, a in pairs if a["slo_latency"] <= slo and a["region"] == reg and a["gpu_arch"] == arch
                                  and (not tpm or a["tpm"]) and (not enc or a["memory_encryption"])
                                  and (not fw or a["hardware_firewall"])}
        return lambda pairs: [i for i, a in pairs if a["slo_latency"] <= slo and a["region"] == reg and a["gpu_arch"] == arch
                              and (not tpm or a["tpm"]) and (not enc or a["memory_encryption"])
                              and (not fw or a["hardware_firewall"])]
    if kind == "regional":
        reg = v["region"]
        if as_set:
            return lambda pairs: {i for i, a in pairs if a["slo_latency"] <= slo and a["region"] == reg}
        return lambda pairs: [i for i, a in pairs if a["slo_latency"] <= slo and a["region"] == reg]
    if as_set:
        return lambda pairs: {i for i, a in pairs if a["slo_latency"] <= slo}
    return lambda pairs: [i for i, a in pairs if a["slo_latency"] <= slo]


def condition(kind: str, v: dict):  # type: ignore[no-untyped-def]
    """The same conditions for one instance's attributes (the naive single check)."""
    slo = v["slo"]
    if kind == "selective":
        fam, reg = v["family"], v["region"]
        return lambda a: a["slo_latency"] <= slo and a["labels.family"] == fam and a["region"] == reg and a["tpm"]
    if kind == "compliance":
        reg, arch = v["region"], v["arch"]
        tpm, enc, fw = v.get("need_tpm", False), v.get("need_encryption", False), v.get("need_firewall", False)
        return lambda a: (a["slo_latency"] <= slo and a["region"] == reg and a["gpu_arch"] == arch and (not tpm or a["tpm"])
                          and (not enc or a["memory_encryption"]) and (not fw or a["hardware_firewall"]))
    if kind == "regional":
        reg = v["region"]
        return lambda a: a["slo_latency"] <= slo and a["region"] == reg
    return lambda a: a["slo_latency"] <= slo


def load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def naive_pairs(bundle, batch: InstanceBatch) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    """The naive scan's fleet: (id, attributes) per instance, the attributes as the matcher
    defines them (one admission per signature, a dict per instance)."""
    adm = AdmissionCache(bundle)
    s = batch.strs
    codes = adm.codes(batch.ids, batch.models, [s[f] if f in s else batch.flags[f] for f in SIGNATURE_FIELDS])
    row = adm.row
    return [(iid, row(c, h, n, lab)) for iid, c, h, n, lab in zip(batch.ids, codes, s["host"], batch.numa, batch.labels)]


def store_records(batch: InstanceBatch) -> list[tuple[str, bytes]]:
    """The fleet as the store keeps it (`cluster/instance_codec.py`: JSON of the instance and
    its score under its key), for the snapshot load."""
    out = []
    for i in range(len(batch)):
        inst = batch.instance(i)
        out.append((f"/policyc/instances/{inst.id}",
                    json.dumps({"instance": inst.model_dump(mode="json"), "score": batch.scores[i]},
                               sort_keys=True, separators=(",", ":")).encode()))
    return out


def fleet_scale(args: argparse.Namespace) -> None:
    n_inst = args.instances
    print(f"\n=== fleet scale, {n_inst:,} instances: 50 families x 8 regions x 4 architectures, an SLO per deployment ===")
    print(f"machine: load average {load()} (1 / 5 / 15 min) on {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    fb = fleet_shapes.make_fleet_batch(n_inst, seed=7)  # the store's data, as columns
    gen_s = time.perf_counter() - t0
    gc.collect()
    rss0 = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    reg = Registry(fb.bundle)
    reg.add_batch(fb.batch)
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    gc.collect()
    rss1 = rss_mb()
    prebuild_line = warm(reg, rss1)
    ix = reg.index
    print(f"fleet: {len(reg):,} instances, {len(fb.bundle.contracts):,} contracts, "
          f"{len(ix.attr_index['slo_latency'].keys)} distinct SLOs, {len(ix.bloom.shards)} shards, "
          f"{len(reg._tiers.tiers)} score tiers (columns generated in {gen_s:.1f} s)")
    print(f"setup, registry from columns (Registry.add_batch): {build_s:.2f} s wall, {build_cpu:.2f} s CPU, "
          f"+{rss1 - rss0:.0f} MB RSS  (floor: 3 s at 100k; 20 s and 1.5 GB at 1M)")
    print(prebuild_line)
    gc.collect()
    r0 = rss_mb()
    t0 = time.perf_counter()
    pairs = naive_pairs(fb.bundle, fb.batch)
    naive_s = time.perf_counter() - t0
    gc.collect()
    print(f"setup, naive (id, attributes) pairs from the same columns: {naive_s:.2f} s wall, +{rss_mb() - r0:.0f} MB RSS")
    if args.admits_only:
        reqs = fleet_shapes.request_mix(max(400, args.requests * 4), seed=101)
        for _, h in reqs[:400]:  # warm-up: other new requests, as a running service has seen
            reg.admits(reg.parse_request(h), fb.batch.ids[0])
        single_checks(reg, pairs, [(kind, reg.parse_request(h)) for kind, h in fleet_shapes.request_mix(2000, seed=202)])
        print(f"machine now: load average {load()}")
        return
    if args.store or n_inst <= 200_000:
        recs = store_records(fb.batch)
        gc.collect()
        r0 = rss_mb()
        t0, c0 = time.perf_counter(), time.process_time()
        decoded = ((k, body["instance"], body.get("score")) for k, body in ((k, json.loads(v)) for k, v in recs))
        reg2 = Registry(fb.bundle, prebuild=False)
        reg2.add_batch(InstanceBatch.from_records(decoded))
        st_s, st_cpu = time.perf_counter() - t0, time.process_time() - c0
        gc.collect()
        print(f"setup, registry from the store's records (JSON decoded, InstanceBatch.from_records, add_batch): "
              f"{st_s:.2f} s wall, {st_cpu:.2f} s CPU, +{rss_mb() - r0:.0f} MB RSS")
        assert len(reg2) == len(reg)
        del reg2, recs, decoded
        gc.collect()
    n = max(400, args.requests * 4)
    seen: set[tuple] = set()
    for _, h in fleet_shapes.request_mix(n, seed=101):  # warm-up: other new requests
        q = reg.parse_request(h)
        seen.add(tuple(q.vars.items()))
        reg.match(q, 1)
    reqs = fleet_shapes.request_mix(n, seed=202)
    parsed = [(kind, reg.parse_request(h)) for kind, h in reqs]
    new_raw = sum(tuple(q.vars.items()) not in seen for _, q in parsed)
    lat: dict[str, list[float]] = {k: [] for k in fleet_shapes.KINDS}
    counts: dict[str, list[int]] = {k: [] for k in fleet_shapes.KINDS}
    bases, rs = ix.bases, ix.rank_stats
    bh0, bm0, r0_, d0, b0 = bases.hits, bases.misses, rs.by_ranks, rs.by_bitmap, rs.builds
    cpu: dict[str, list[float]] = {k: [] for k in fleet_shapes.KINDS}
    pc, tc = time.perf_counter_ns, time.thread_time_ns
    made: list[bool] = []  # whether the request made its base (fixed values never seen before)
    gc.disable()
    for kind, q in parsed:
        b = bases.misses
        c = tc()
        t = pc()
        m = reg.match(q, 1)
        lat[kind].append((pc() - t) / 1e3)
        cpu[kind].append((tc() - c) / 1e3)
        counts[kind].append(m.count)
        made.append(bases.misses != b)
    gc.enable()
    bhits, bmisses = bases.hits - bh0, bases.misses - bm0
    print(f"\nbest candidate, match(request, k=1), {n} requests, {new_raw / n:.1%} of them raw shapes never seen "
          f"before; their fixed values (base) seen before {bhits / max(1, bhits + bmisses):.1%}; answered by threshold "
          f"ranks {rs.by_ranks - r0_}, from the base's bitmap {rs.by_bitmap - d0}, ranks built {rs.builds - b0}  "
          f"(floor: p50 <= 10 us, p99 <= 50 us)")
    print("wall µs, and the thread's CPU µs (what the call cost when the shared machine let it run; the clock read included)")
    print(f"{'kind':<12}{'p50':>8}{'p99':>8}{'p99.9':>8}{'cpu p50':>9}{'cpu p99':>9}{'matches (median)':>18}")
    for k in fleet_shapes.KINDS:
        print(f"{k:<12}{pct(lat[k], 50):>8.1f}{pct(lat[k], 99):>8.1f}{pct(lat[k], 99.9):>8.1f}{pct(cpu[k], 50):>9.1f}"
              f"{pct(cpu[k], 99):>9.1f}{statistics.median(counts[k]):>18,.0f}")
    all_lat = [x for k in fleet_shapes.KINDS for x in lat[k]]
    all_cpu = [x for k in fleet_shapes.KINDS for x in cpu[k]]
    print(f"{'all':<12}{pct(all_lat, 50):>8.1f}{pct(all_lat, 99):>8.1f}{pct(all_lat, 99.9):>8.1f}{pct(all_cpu, 50):>9.1f}"
          f"{pct(all_cpu, 99):>9.1f}")
    lk = []
    for _, q in parsed[:1000]:
        t = pc()
        reg.match(q, 32, distinct_gpus=True)
        lk.append((pc() - t) / 1e3)
    print(f"match(request, k=32, distinct_gpus) (what Decide asks for): p50 {pct(lk, 50):.1f} µs, p99 {pct(lk, 99):.1f} µs")

    answer_forms(reg, pairs, parsed, counts, args)
    single_checks(reg, pairs, parsed)

    if n_inst <= 200_000:
        entries = reg.entries()
        for kind in fleet_shapes.KINDS:  # the naive scan agrees on a sample
            _, q = next(p for p in parsed if p[0] == kind)
            ans = naive_match(fb.bundle, entries, q.vars, 1)
            m = reg.match(q, 1)
            assert m.count == len(ans.ids) and tuple(s.instance.id for s in m.best) == ans.best, kind
        print("naive scan (naive_match): same count and best candidate on one request of each kind")
        del entries

    rng = random.Random(9)
    victims = [fb.batch.instance(i) for i in rng.sample(range(len(fb.batch)), 2000)]
    rem, add, sc = [], [], []
    for inst in victims:
        t = pc()
        reg.remove(inst.id)
        rem.append((pc() - t) / 1e3)
        t = pc()
        reg.add(inst, rng.random())
        add.append((pc() - t) / 1e3)
        t = pc()
        reg.set_score(inst.id, rng.random())
        sc.append((pc() - t) / 1e3)
    print(f"\nupdates at fleet scale, µs: add p50 {pct(add, 50):.1f} p99 {pct(add, 99):.1f}; "
          f"remove p50 {pct(rem, 50):.1f} p99 {pct(rem, 99):.1f}; set_score p50 {pct(sc, 50):.1f} p99 {pct(sc, 99):.1f}")
    churn = []
    for (_, q), inst in zip(parsed[:1000], victims):
        reg.remove(inst.id)
        reg.add(inst, 0.5)
        t = pc()
        reg.match(q, 1)
        churn.append((pc() - t) / 1e3)
    print(f"best candidate after a membership change before each request: p50 {pct(churn, 50):.1f} µs, p99 {pct(churn, 99):.1f} µs")
    print(f"machine now: load average {load()}")


FORM_COLS = ("bitmap", "slots", "ids", "id_set", "instances")
OBJECTS_MOST = 100_000


def answer_forms(reg: Registry, pairs: list, parsed: list, counts: dict, args: argparse.Namespace) -> None:
    """`Registry.matches` in each form against the list (and set) comprehension over the same
    fleet, same run, alternating; each answer checked equal to the comprehension's."""
    pc = time.perf_counter_ns
    per_kind = args.per_kind or (6 if args.quick else 20)
    few = 2  # the objects form makes an object per match: a couple of requests per kind
    t_form: dict[tuple[str, str], list[float]] = {}
    t_naive: dict[str, list[float]] = {k: [] for k in fleet_shapes.KINDS}
    t_naive_set: dict[str, list[float]] = {k: [] for k in fleet_shapes.KINDS}
    got_counts: dict[str, list[int]] = {k: [] for k in fleet_shapes.KINDS}
    for kind in fleet_shapes.KINDS:
        # the broadest requests of each kind: the forms' cost grows with the matches, the
        # comprehension's does not, so these are the forms' worst case
        of_kind = sorted((q for k_, q in parsed if k_ == kind), key=lambda q: -reg.matches(q, "bitmap").count)
        for j, q in enumerate(of_kind[:per_kind]):
            v = dict(q.vars)
            lc, ls = comprehension(kind, v), comprehension(kind, v, as_set=True)
            reg.matches(q, "slots")  # the plan made once (as a repeated request finds it); every form then reads it
            # objects: a couple of requests a kind, and none past OBJECTS_MOST matches (seconds each)
            forms = FORM_COLS if j < few and reg.matches(q, "bitmap").count <= OBJECTS_MOST else FORM_COLS[:-1]
            for f in (forms if j % 2 else tuple(reversed(forms))):
                gc.disable()
                t = pc()
                got = reg.matches(q, f)
                t_form.setdefault((kind, f), []).append((pc() - t) / 1e3)
                gc.enable()
                if f == "id_set":
                    ids = got.id_set
                del got
            gc.disable()
            t = pc()
            want = lc(pairs)
            t_naive[kind].append((pc() - t) / 1e3)
            t = pc()
            want_set = ls(pairs)
            t_naive_set[kind].append((pc() - t) / 1e3)
            gc.enable()
            assert ids == want_set == set(want), (kind, v)
            got_counts[kind].append(len(want))
            del want, want_set, ids
    print(f"\nall matches by answer form, Registry.matches against the list / set comprehension over the same "
          f"{len(pairs):,} (id, attributes) pairs, same run, alternating; median µs and ratio to the comprehension "
          f"(ids as a set against the set comprehension); the {per_kind} broadest requests of each kind, objects on {few}  "
          f"(floor: array forms <= 0.5x on broad, never slower, selective <= 0.05x)")
    head = f"{'kind':<12}{'matches':>10}{'naive list':>11}{'naive set':>10}"
    for f in FORM_COLS:
        head += f"{f:>11}{'x':>7}"
    print(head)
    for k in fleet_shapes.KINDS:
        nl, ns = statistics.median(t_naive[k]), statistics.median(t_naive_set[k])
        line = f"{k:<12}{statistics.median(got_counts[k]):>10,.0f}{nl:>11.0f}{ns:>10.0f}"
        for f in FORM_COLS:
            ts = t_form.get((k, f), [])
            if not ts:
                line += f"{'-':>11}{'-':>7}"
                continue
            # the ratio: the median of each request's own ratio (the same request's naive time)
            rs = [a / b for a, b in zip(ts, t_naive_set[k] if f == "id_set" else t_naive[k])]
            line += f"{statistics.median(ts):>11.1f}{statistics.median(rs):>7.3f}"
        print(line)
    worst = {f: max(max(a / b for a, b in zip(t_form[(k, f)], t_naive_set[k] if f == "id_set" else t_naive[k]))
                    for k in fleet_shapes.KINDS if t_form.get((k, f))) for f in FORM_COLS}
    print("worst single-request ratio per form: " + ", ".join(f"{f} {w:.3f}" for f, w in worst.items()))


def single_checks(reg: Registry, pairs: list, parsed: list) -> None:
    """One instance checked by id (`Registry.admits`) against the naive check of that one
    instance's attributes (its conditions inline), same requests, same ids."""
    pc = time.perf_counter_ns
    rng = random.Random(11)
    attrs_of = dict(pairs)
    ids = list(attrs_of)
    sample = parsed[:2000]
    picks = [rng.choice(ids) for _ in sample]
    conds = [condition(kind, dict(q.vars)) for kind, q in sample]
    mine, naive = [], []
    agree = hits = 0
    gc.disable()
    for (kind, q), iid, cond in zip(sample, picks, conds):
        t = pc()
        a = reg.admits(q, iid)
        mine.append((pc() - t) / 1e3)
        t = pc()
        b = cond(attrs_of[iid])
        naive.append((pc() - t) / 1e3)
        agree += a == bool(b)
        hits += a
    gc.enable()
    print(f"\none instance checked by id, Registry.admits(request, id), {len(sample)} new requests each with a random id "
          f"({hits} admitted): p50 {pct(mine, 50):.2f} µs, p99 {pct(mine, 99):.2f} µs; naive (that instance's "
          f"attributes, conditions inline) p50 {pct(naive, 50):.2f} µs  (floor: <= 2 µs)")
    assert agree == len(sample), f"admits disagrees with the naive check on {len(sample) - agree} of {len(sample)}"


def five_contracts(args: argparse.Namespace) -> None:
    rng = random.Random(7)
    result = compile_paths([str(REPO / "policies")], analyse=False)
    assert result.ok, [str(d) for d in result.diagnostics]
    bundle = result.bundle
    insts = fleet(bundle, args.instances, rng)
    scores = {i.id: rng.random() for i in insts}
    gc.collect()
    rss0 = rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    reg = Registry(bundle, insts, scores)
    build_s, build_cpu = time.perf_counter() - t0, time.process_time() - c0
    gc.collect()
    rss1 = rss_mb()
    print(warm(reg, rss1))
    ix = reg.index
    print(f"fleet: {len(reg):,} instances, {len(ix.bloom.shards)} shards of {ix.shard_size}, "
          f"{len(reg._tiers.tiers)} score tiers")
    print(f"index build: {build_s:.2f} s wall, {build_cpu:.2f} s CPU (floor 3 s); "
          f"memory: +{rss1 - rss0:.0f} MB RSS for the registry and index")
    print(f"machine: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())} (1 / 5 / 15 min) on "
          f"{os.cpu_count()} CPUs")

    reqs = requests(bundle, args.requests, rng)
    parsed = [(kind, reg.parse_request(h)) for kind, h in reqs]
    for kind, q in parsed[:200]:  # warm up
        reg.match(q, 1)
    lat: dict[str, list[float]] = {k: [] for k in KINDS}
    e2e: dict[str, list[float]] = {k: [] for k in KINDS}
    counts: dict[str, list[int]] = {k: [] for k in KINDS}
    skipped: dict[str, list[float]] = {k: [] for k in KINDS}
    pc = time.perf_counter_ns
    gc.disable()
    plans = ix.plans
    answers = reg._answers  # k = 1 looks a repeated request's answer up first, then its plan
    hits0, misses0 = answers.hits, answers.misses
    for (kind, q), (_, h) in zip(parsed, reqs):
        t = pc()
        m = reg.match(q, 1)
        lat[kind].append((pc() - t) / 1e3)
        counts[kind].append(m.count)
        t = pc()
        reg.match(reg.parse_request(h), 1)
        e2e[kind].append((pc() - t) / 1e3)
    gc.enable()
    hit_rate = (answers.hits - hits0) / max(1, answers.hits - hits0 + answers.misses - misses0)
    for kind, q in parsed:  # Bloom skip rate, outside the timed loop
        survivors = ix.shard_survivors(ix.applicable(q.vars), q.vars)
        skipped[kind].append(0.0 if survivors is None else 1 - len(survivors) / len(ix.bloom.shards))
    churn = {k: [] for k in KINDS}
    cold = {k: [] for k in KINDS}
    victims_c = rng.sample(insts, len(parsed))
    gc.disable()
    for (kind, q), inst in zip(parsed, victims_c):  # every request after a membership change
        reg.remove(inst.id)
        reg.add(inst, scores[inst.id])
        t = pc()
        reg.match(q, 1)
        churn[kind].append((pc() - t) / 1e3)
    sizes = [(c, c.size) for c in (plans, ix.reduced, ix.bases, reg._answers)]
    for c, _ in sizes:
        c.size = 0
        c.clear()
    for kind, q in parsed:  # no plan cache: planned and intersected from scratch
        t = pc()
        reg.match(q, 1)
        cold[kind].append((pc() - t) / 1e3)
    for c, size in sizes:
        c.size = size
    gc.enable()
    all_lat = [x for k in KINDS for x in lat[k]]
    print("\nmatch(request, k=1) on parsed requests, µs (floor: p50 ≤ 20, p99 ≤ 100)")
    print(f"{'kind':<12}{'p50':>8}{'p99':>8}{'parse+match p50':>17}{'p99':>8}{'matches (median)':>18}{'Bloom skip':>12}")
    for k in KINDS:
        print(f"{k:<12}{pct(lat[k], 50):>8.1f}{pct(lat[k], 99):>8.1f}{pct(e2e[k], 50):>17.1f}{pct(e2e[k], 99):>8.1f}"
              f"{statistics.median(counts[k]):>18,.0f}{statistics.mean(skipped[k]):>11.1%}")
    print(f"{'all':<12}{pct(all_lat, 50):>8.1f}{pct(all_lat, 99):>8.1f}   (answer cache hit rate {hit_rate:.1%})")
    print("\nwithout reusing candidates, µs:  churn = a membership change before each request;"
          "  cold = plan cache off")
    print(f"{'kind':<12}{'churn p50':>10}{'p99':>8}{'cold p50':>10}{'p99':>8}")
    for k in KINDS:
        print(f"{k:<12}{pct(churn[k], 50):>10.1f}{pct(churn[k], 99):>8.1f}{pct(cold[k], 50):>10.1f}{pct(cold[k], 99):>8.1f}")
    all_churn = [x for k in KINDS for x in churn[k]]
    all_cold = [x for k in KINDS for x in cold[k]]
    print(f"{'all':<12}{pct(all_churn, 50):>10.1f}{pct(all_churn, 99):>8.1f}{pct(all_cold, 50):>10.1f}{pct(all_cold, 99):>8.1f}")
    for k_, distinct in ((10, False), (32, False), (32, True)):
        lk = []
        for kind, q in parsed[:400]:
            t = pc()
            reg.match(q, k_, distinct_gpus=distinct)
            lk.append((pc() - t) / 1e3)
        print(f"match(request, k={k_}{', distinct_gpus' if distinct else ''}), all kinds: p50 {pct(lk, 50):.1f} µs, "
              f"p99 {pct(lk, 99):.1f} µs" + ("  (what the decision service asks for)" if distinct else ""))

    # registry updates while serving
    victims = rng.sample(insts, 2000)
    rem, add, sc = [], [], []
    for inst in victims:
        t = pc(); reg.remove(inst.id); rem.append((pc() - t) / 1e3)
        t = pc(); reg.add(inst, scores[inst.id]); add.append((pc() - t) / 1e3)
        t = pc(); reg.set_score(inst.id, rng.random()); sc.append((pc() - t) / 1e3)
    print(f"\nupdates, µs (floor 50): add p50 {pct(add, 50):.1f} p99 {pct(add, 99):.1f}; "
          f"remove p50 {pct(rem, 50):.1f} p99 {pct(rem, 99):.1f}; set_score p50 {pct(sc, 50):.1f} p99 {pct(sc, 99):.1f}")
    score_pushes(reg, insts, rng)
    print(f"machine now: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")

    # Bloom filter false positives: every (shard, key) pair where the key is absent
    bloom = ix.bloom
    keys = {key for counts_ in bloom.keys.values() for key in counts_}
    fp = neg = 0
    for key in keys:
        maybe = bloom.maybe(key) & bloom.shards
        exact = {s for s, c in bloom.keys.items() if key in c}
        neg += len(bloom.shards) - len(exact)
        fp += len([s for s in maybe if s not in exact])
    print(f"Bloom: {len(keys)} distinct keys over {len(bloom.shards)} shards; false-positive rate {fp / max(neg, 1):.2%} "
          f"({fp} of {neg} absent (shard, key) pairs); m={bloom.m} bits, k={bloom.k}")

    # the naive scan, same run, same answers
    per_kind = 2 if args.quick else 5
    entries = reg.entries()
    naive: dict[str, list[float]] = {k: [] for k in KINDS}
    for kind in KINDS:
        for _, q in [p for p in parsed if p[0] == kind][:per_kind]:
            t = pc()
            ans = naive_match(bundle, entries, q.vars, 1)
            naive[kind].append((pc() - t) / 1e3)
            m = reg.match(q, 1)
            assert m.count == len(ans.ids) and tuple(s.instance.id for s in m.best) == ans.best, (kind, q)
    print("\nnaive scan (every instance, compiled rules), ms per request, and ratio to the index (p50; cached plans,"
          " and cold: plan cache off):")
    for k in KINDS:
        n50 = statistics.median(naive[k])
        print(f"  {k:<12}{n50 / 1e3:>9.1f} ms   index is {n50 / pct(lat[k], 50):,.0f}× faster "
              f"(cold: {n50 / pct(cold[k], 50):,.0f}×)")

    # Cedar, evaluating each candidate instance
    try:
        import cedarpy
    except ImportError:
        print("\ncedarpy not installed: Cedar comparison skipped")
        return
    # Cedar evaluates one request per candidate instance; at ~0.3 ms per evaluation the
    # whole fleet costs tens of seconds per request, so it runs on a slice and the per-request
    # figure is scaled to the full fleet (linear: one evaluation per instance)
    cedar_n = 1 if args.quick else 2
    sl = entries[:: max(1, len(entries) // 2000)]
    policies = cedarpy.PolicySet.from_str(CEDAR_POLICIES)
    ents = cedarpy.Entities.from_json_str(__import__("json").dumps(cedar_entities(sl)))
    print(f"\nCedar (cedarpy {getattr(cedarpy, '__version__', '')}): each request evaluated against every instance of a "
          f"{len(sl):,}-instance slice, scaled ×{len(entries) / len(sl):.0f} to the fleet")
    for kind in KINDS:
        times = []
        for _, q in [p for p in parsed if p[0] == kind][:cedar_n]:
            ctx = cedar_context(q.vars)
            t = pc()
            batch = [{"principal": 'Client::"c"', "action": 'Action::"serve"',
                      "resource": {"type": "Instance", "id": inst.id}, "context": ctx} for inst, _, _ in sl]
            res = cedarpy.is_authorized_batch(batch, policies, ents)
            allowed = [e for e, r in zip(sl, res) if r.allowed]
            best = min(allowed, key=lambda e: (-e[2], e[0].id))[0].id if allowed else None
            times.append((pc() - t) / 1e3 * len(entries) / len(sl))
            ans = naive_match(bundle, sl, q.vars, 1)
            assert len(allowed) == len(ans.ids) and (best,) == (ans.best or (None,)), kind
        c50 = statistics.median(times)
        print(f"  {kind:<12}{c50 / 1e6:>9.2f} s per request (scaled)   index is {c50 / pct(lat[kind], 50):,.0f}× faster "
              f"(cold: {c50 / pct(cold[kind], 50):,.0f}×)")


if __name__ == "__main__":
    main()
