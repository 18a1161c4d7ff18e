"""Request parsing (units, ranges, missing/malformed behaviour, unknown headers, tenants),
registry errors, swaps and explain — expected messages written by hand."""

from __future__ import annotations

import random
import threading

import pytest

from policyc.cli.main import main
from policyc.compiler.bundle import Bundle
from policyc.matcher import AdmissionError, Registry, RegistryError, RequestError, UnknownInstanceError

from matcher_support import REPO, admissible


def problems(reg: Registry, headers: dict[str, str], tenant: str | None = None) -> dict[str, str]:
    with pytest.raises(RequestError) as e:
        reg.parse_request(headers, tenant)
    return {p.field: p.message for p in e.value.problems}


def test_values_parse_by_type_to_si(shapes_bundle: Bundle) -> None:
    reg = Registry(shapes_bundle)
    q = reg.parse_request({"x-slo-latency": "1.5s", "X-Min-Bandwidth": "80GB/s", "X-Max-Flops": "1.2 TFLOP",
                           "X-Secure": "Yes", "X-Team": "risk", "X-Data-Region": "eu-west", "User-Agent": "curl", ":path": "/x"})
    assert q.vars == {"slo": 1.5, "min_bw": 80e9, "max_flops": 1.2e12, "secure": True, "team": "risk",
                      "region": "eu-west", "tenant": "anonymous", "tenant_class": "public"}
    assert reg.parse_request({"X-SLO-Latency": "150 ms"}).vars["slo"] == pytest.approx(0.15)


def test_every_bad_header_is_named(shapes_bundle: Bundle) -> None:
    reg = Registry(shapes_bundle)
    assert problems(reg, {"X-SLO-Latency": "80GB/s", "X-Data-Region": "mars", "X-Secure": "maybe", "X-Foo": "1",
                          "X-Tenant": "acme"}) == {
        "X-SLO-Latency": "`80GB/s` is a bandwidth (MB/s, GB/s, Gbit/s, …); expected a time (ns, us, ms, s, min)",
        "X-Data-Region": "`mars` is not one of us-west, us-east, eu-west, eu-central",
        "X-Secure": "`maybe` is not yes/no/true/false",
        "X-Foo": "unknown header; this policy reads X-Data-Region, X-Max-Flops, X-Min-Bandwidth, X-Model, "
                 "X-Secure, X-SLO-Latency, X-Team, X-Tenant",
        "X-Tenant": "unknown tenant `acme`; did you mean `acme-bank`?",
    }
    assert problems(reg, {"X-SLO-Latency": "90 s"}) == {"X-SLO-Latency": "`90 s` is out of range 1 ms .. 60 s"}
    assert problems(reg, {"X-SLO-Latency": "150"}) == {"X-SLO-Latency": "`150` has no unit; expected a time (ns, us, ms, s, min)"}
    assert problems(reg, {"X-Tenant": "acme-bank"}, tenant="st-marys") == {
        "X-Tenant": "says `acme-bank` but the caller is authenticated as `st-marys`"}


def test_malformed_ignore_drops_the_header(shapes_bundle: Bundle) -> None:
    reg = Registry(shapes_bundle)
    assert "model" not in reg.parse_request({"X-Model": "not a name!"}).vars


def test_registry_refusals_name_the_instance(shapes_bundle: Bundle) -> None:
    reg = Registry(shapes_bundle)
    inst = admissible(shapes_bundle, random.Random(1), "a", model="fraud-scorer")
    bad = inst.model_copy(update={"id": "b", "deployment": inst.deployment.model_copy(update={"tpm": False})})
    with pytest.raises(AdmissionError, match="instance `b` cannot be registered: contract `fraud-scorer` requires `tpm`"):
        reg.add(bad)
    reg.add(inst)
    with pytest.raises(RegistryError, match="instance `a` is already registered"):
        reg.add(inst)
    with pytest.raises(UnknownInstanceError, match="no instance `zz` is registered"):
        reg.remove("zz")
    with pytest.raises(RegistryError, match=r"score must be a number in \[0, 1\], got `1.5`"):
        reg.set_score("a", 1.5)
    assert len(reg) == 1


def test_swap_bundle_refuses_or_evicts(shapes_bundle: Bundle, policies_bundle: Bundle) -> None:
    reg = Registry(shapes_bundle)
    reg.add(admissible(shapes_bundle, random.Random(2), "x", model="recommender"))
    no_reco = shapes_bundle.model_copy(update={"contracts": tuple(c for c in shapes_bundle.contracts if c.name != "recommender")})
    with pytest.raises(RegistryError, match="does not admit registered instances: x: unknown model `recommender`"):
        reg.swap_bundle(no_reco)
    assert reg.swap_bundle(no_reco, evict_inadmissible=True) == ("x",)
    assert len(reg) == 0 and reg.bundle is no_reco


def test_explain_counts_per_rule_and_predicate(policies_bundle: Bundle) -> None:
    rng = random.Random(3)
    reg = Registry(policies_bundle, [admissible(policies_bundle, rng, f"i{n}") for n in range(200)])
    q = reg.parse_request({"X-Tenant": "st-marys", "X-Data-Region": "us-west"})
    ex = reg.explain(q)
    assert ex.count == reg.match(q).count == 0
    by = {r.id: r for r in ex.rules}
    assert by["routing.pinned-model"].why == "request variable `model` is absent"
    assert by["compliance.finance-hardening"].why == "guard is false"
    region_pred = by["compliance.healthcare-eu"].predicates[0]
    assert region_pred.predicate == "region in [eu-west, eu-central]"
    assert region_pred.failing == sum(1 for _, a, _ in reg.entries() if a["region"] not in ("eu-west", "eu-central"))


def test_readers_never_see_half_an_update(policies_bundle: Bundle) -> None:
    """A writer moves instances between regions; every read sees the fleet whole."""
    rng = random.Random(4)
    insts = [admissible(policies_bundle, rng, f"i{n}", model="recommender") for n in range(300)]
    reg = Registry(policies_bundle, insts)
    west = reg.parse_request({"X-Data-Region": "us-west"})
    east = reg.parse_request({"X-Data-Region": "us-east"})
    everyone = reg.parse_request({"X-Model": "recommender"})
    moved = [i for i in insts if i.deployment.region in ("us-west", "us-east")]
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            for i in moved:
                region = "us-east" if reg.get(i.id).deployment.region == "us-west" else "us-west"
                reg.update(i.model_copy(update={"deployment": i.deployment.model_copy(update={"region": region})}))
    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(300):  # an update is remove + insert: a half-applied one would show 299
            assert reg.match(everyone).count == 300
            assert len(reg.entries()) == 300
    finally:
        stop.set()
        t.join()
    assert reg.match(west).count + reg.match(east).count == len(moved)


def test_policyc_test_cli(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    assert main(["test", str(REPO / "policies"), "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "7 passed, 0 failed" in out and "coverage: 6/6 rules exercised" in out
    bad = tmp_path / "bad_test.toml"
    bad.write_text('[[case]]\nname = "wrong"\nheaders = { X-Tenant = "acme-bank" }\nadmitted = true\n'
                   '[[case]]\nname = "typo"\nadmited = true\n', encoding="utf-8")
    assert main(["test", str(REPO / "policies"), "--tests", str(bad)]) == 1
    assert "bad_test.toml:5:1: error[E802]: case 2 ('typo'): `admitted` is required" in capsys.readouterr().out
    copies = tmp_path / "copies_test.toml"
    dep = 'deployment = { host = "h1", gpu = "gpu0", gpu_model = "A100-80G", region = "us-west", tpm = true, ' \
          'memory_encryption = true, hardware_firewall = true }\n'
    copies.write_text('[[instance]]\nid = "a"\nmodel = "fraud-scorer"\nscore = 0.9\n' + dep +
                      '[[instance]]\nid = "b"\nmodel = "fraud-scorer"\nscore = 0.4\n' + dep +
                      '[[case]]\nname = "any"\nheaders = { X-Model = "fraud-scorer" }\nadmitted = true\n', encoding="utf-8")
    assert main(["test", str(REPO / "policies"), "--tests", str(copies)]) == 1
    out = capsys.readouterr().out
    assert "instances `a` (score 0.9) and `b` (score 0.4) are copies of `fraud-scorer` on h1/gpu0" in out, out
    copies.write_text(copies.read_text(encoding="utf-8").replace("score = 0.4\n", ""), encoding="utf-8")
    assert main(["test", str(REPO / "policies"), "--tests", str(copies)]) == 0  # no score: the group's


def test_distinct_gpus_offers_each_model_on_each_gpu_once(shapes_bundle: Bundle) -> None:
    """Instances of a model packed onto a few GPUs share each GPU's score; asked for distinct
    GPUs, the best k are the best instance of each (model, GPU), through adds, score moves
    and removals."""
    rng = random.Random(7)
    model = shapes_bundle.contracts[0].name
    base = admissible(shapes_bundle, rng, "seed", model=model)
    packed = []
    for n in range(40):  # 40 instances of one model on 4 GPUs of one host
        d = base.deployment.model_copy(update={"gpu": f"gpu{n % 4}"})
        packed.append(base.model_copy(update={"id": f"m{n:02d}", "deployment": d}))
    reg = Registry(shapes_bundle)
    reg.add_many(packed, {x.id: [0.9, 0.7, 0.5, 0.3][int(x.deployment.gpu[3])] for x in packed})
    q = reg.parse_request({})
    plain = reg.match(q, 8)
    assert {s.instance.deployment.gpu for s in plain.best} == {"gpu0"}  # eight copies of one choice
    got = reg.match(q, 8, distinct_gpus=True)
    assert [s.instance.id for s in got.best] == ["m00", "m01", "m02", "m03"] and got.count == plain.count == 40
    reg.set_scores([(x.id, 0.95) for x in packed if x.deployment.gpu == "gpu2"])
    assert [s.instance.id for s in reg.match(q, 2, distinct_gpus=True).best] == ["m02", "m00"]
    reg.remove("m02")
    assert [s.instance.id for s in reg.match(q, 2, distinct_gpus=True).best] == ["m06", "m00"]
