"""`fmt` is idempotent and meaning-preserving: parse(fmt(x)) == parse(x) on generated trees
and on every shipped policy; and no input, however broken, produces a traceback."""

from __future__ import annotations

import json
import string

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policyc.compiler.pipeline import compile_sources
from policyc.dsl import ast
from policyc.dsl.parser import parse
from policyc.dsl.printer import format_file
from policyc.dsl.source import Source

from policy_text import REPO

KEYWORDS = {"and", "or", "not", "in", "of"}
UNIT_WORDS = {"ns", "us", "ms", "s", "min", "h", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB",
              "FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"}
UNITS = ["ms", "s", "us", "GB/s", "Gbit/s", "MB", "GiB", "TFLOP/s", "FLOP", "%"]

names = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_]{0,6}(-[a-z0-9]{1,4})?\Z").filter(lambda n: n not in KEYWORDS | UNIT_WORDS)
numbers = st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,2})?\Z")
strings = st.text(alphabet=string.ascii_letters + string.digits + " -_.\"\\é", max_size=10).map(lambda s: json.dumps(s, ensure_ascii=False))

dotted = st.lists(names, min_size=1, max_size=3).map(lambda p: ast.Name(tuple(p)))
quantity = st.builds(lambda n, u, of: ast.Quantity(n, u, of), numbers, st.none() | st.sampled_from(UNITS), st.none() | dotted)
simple = st.one_of(quantity, dotted, strings.map(ast.String), st.builds(lambda a, b: ast.Range(a, b), quantity, quantity))


def _compound(children):
    return st.one_of(
        st.lists(children, max_size=3).map(lambda xs: ast.ListValue(tuple(xs))),
        st.builds(lambda op, v: ast.Bound(op, v), st.sampled_from(["<=", ">=", "<", ">", "==", "!="]), children),
        st.builds(lambda a, op, b: ast.Compare(a, op, b), children, st.sampled_from(["==", "<=", ">", "in", "not_in"]), children),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: ast.And(tuple(xs))),
        st.lists(children, min_size=2, max_size=3).map(lambda xs: ast.Or(tuple(xs))),
        children.map(ast.Not),
        st.builds(lambda f, xs: ast.Call(f, tuple(xs)), names, st.lists(children, max_size=2)),
    )


values = st.recursive(simple, _compound, max_leaves=8)
labels = st.lists(st.one_of(names.map(lambda n: ast.Label(n, False)),
                            st.text(alphabet=string.ascii_letters + " .", max_size=6).map(lambda s: ast.Label(s, True))), max_size=3)
fields = st.builds(lambda k, q, vs: ast.Field(k, q, tuple(vs)), names, st.just(False), st.lists(values, min_size=1, max_size=3))
items = st.recursive(fields, lambda kids: st.builds(lambda k, ls, xs: ast.Block(k, tuple(ls), tuple(xs)), names, labels,
                                                    st.lists(kids, max_size=4)), max_leaves=10)
files = st.lists(items, max_size=4).map(lambda xs: ast.File("gen.contract", tuple(xs)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files)
def test_parse_of_fmt_equals_tree(tree):
    text = format_file(tree)
    parsed, diags = parse(Source("gen.contract", text))
    assert not diags, (text, diags)
    assert parsed == tree
    assert format_file(parsed) == text


def test_shipped_policies_are_formatted_and_stable():
    for path in sorted((REPO / "policies").rglob("*.contract")):
        src = Source(path.name, path.read_text())
        tree, diags = parse(src)
        assert not diags, path
        out = format_file(tree)
        again, _ = parse(Source(path.name, out))
        assert again == tree
        assert format_file(again) == out


def test_comments_survive_formatting():
    text = "# head\ncontract x version \"1\" {  # trailing\n  # inner\n  a: 1  # after a\n\n  # before b\n  b: 2\n}\n# tail\n"
    tree, _ = parse(Source("c.contract", text))
    out = format_file(tree)
    for c in ("# head", "# trailing", "# inner", "# after a", "# before b", "# tail"):
        assert c in out
    assert format_file(parse(Source("c.contract", out))[0]) == out


_policy_texts = [p.read_text() for p in sorted((REPO / "policies").glob("*.contract"))]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable + "µé{}[]:.<>=\"#", max_size=200))
def test_arbitrary_text_never_raises(text):
    result = compile_sources([Source("fuzz.contract", text)], analyse=False)
    for d in result.diagnostics:
        assert d.message and d.code


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(_policy_texts), st.integers(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=12),
       st.text(alphabet=string.printable, max_size=8))
def test_mutated_policies_never_raise(text, at, cut, insert):
    pos = at % max(len(text), 1)
    mutated = text[:pos] + insert + text[pos + cut:]
    result = compile_sources([Source("m.contract", mutated)], analyse=True)
    assert result.ok or result.errors
