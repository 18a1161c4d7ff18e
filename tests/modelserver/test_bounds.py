"""The request bounds of a served model, as pure functions (the attacks against real
servers are the adversarial corpus's `modelserver` class): what each shape, datatype and
data gets, and that an answer's size follows from the output shape before running."""

from __future__ import annotations

import pytest

from policyc.modelserver.bounds import (
    Bounds, Malformed, TooLarge, check_answer, check_ids, check_shape, flatten, output_follows_input,
)
from policyc.modelserver.rest_guard import check_rest_body

B = Bounds("fraud-scorer", max_sequence=64, max_tokens=128, max_answer_bytes=4 << 20,
           input_dims=("batch", "sequence"), output_dims=("batch", "sequence", 256))


@pytest.mark.parametrize("shape, outcome", [
    ([2, 64], (2, 64)), ([128, 1], (128, 1)), ([1, 64], (1, 64)),
    ([2048, 64], TooLarge), ([3, 64], TooLarge), ([129, 1], TooLarge), ([1, 65], TooLarge),
    ([2**63 - 1, 2**63 - 1], TooLarge),
    ([-1, 4], Malformed), (["1", "4"], Malformed), ([2**64, 1], Malformed), ([1.0, 4], Malformed),
    ([True, 4], Malformed), ([0, 4], Malformed), ([4], Malformed), ([1, 1, 1], Malformed), ([1] * 1000, Malformed),
    ("1,4", Malformed), (None, Malformed),
])
def test_each_shape_gets_its_outcome(shape: object, outcome: object) -> None:
    if isinstance(outcome, tuple):
        assert check_shape(shape, B) == outcome  # type: ignore[arg-type]
    else:
        with pytest.raises(outcome):  # type: ignore[call-overload]
            check_shape(shape, B)  # type: ignore[arg-type]


def test_the_answer_size_comes_from_the_output_shape() -> None:
    assert B.answer_shape(2, 64) == [2, 64, 256]
    assert B.answer_bytes(2, 64, json=False) == 2 * 64 * 256 * 4
    tight = Bounds("m", 64, 128, 65536, ("batch", "sequence"), ("batch", "sequence", 256))
    check_answer(1, 64, tight, json=False)  # exactly the bound
    with pytest.raises(TooLarge, match=r"131072 bytes FP32\), over this server's bound of 65536"):
        check_answer(2, 64, tight, json=False)
    with pytest.raises(TooLarge, match="as JSON"):
        check_answer(1, 64, tight, json=True)


@pytest.mark.parametrize("inputs, outputs, ok", [
    (("batch", "sequence"), ("batch", "sequence", 256), True),
    (("b", "s"), ("b", 10), True),
    (("batch", "sequence"), ("batch", "other", 256), False),  # a size only running can tell
    (("batch", "sequence"), ("batch", -1), False),
])
def test_a_model_whose_answer_size_is_unknown_is_refused_at_load(inputs: tuple, outputs: tuple, ok: bool) -> None:  # type: ignore[type-arg]
    assert (output_follows_input(inputs, outputs) is None) is ok


@pytest.mark.parametrize("data, outcome", [
    ([1, 2, 3], None), ([[1, 2], [3]], None), (["1", 2, 3], "the string `1`"), ([1, 2.5, 3], "2.5"),
    ([1, None, 3], "None"), ([1, 2**63, 3], "beyond INT64"), ([1, -(2**63), 3], None), ([1, 2], "holds 2 values"),
    ([True, 1, 2], "True"),
])
def test_rest_data_must_be_int64_and_as_many_as_the_shape(data: list, outcome: str | None) -> None:  # type: ignore[type-arg]
    if outcome is None:
        check_ids(flatten(data, 3), 3)
    else:
        with pytest.raises(Malformed, match=outcome.replace("(", r"\(")):
            check_ids(flatten(data, 3), 3)


def test_flatten_stops_at_its_limits_without_recursing() -> None:
    deep: list = [1]  # type: ignore[type-arg]
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(Malformed, match="deeper than 64"):
        flatten(deep, 10)
    with pytest.raises(Malformed, match="more than the 3 values"):
        flatten(list(range(1000)), 3)


def test_a_rest_body_is_checked_before_anything_decodes_it() -> None:
    ok = b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}]}'
    check_rest_body(ok, {}, B)
    with pytest.raises(TooLarge, match="takes at most 128"):
        check_rest_body(b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2048, 64], "data": [1]}]}', {}, B)
    with pytest.raises(Malformed, match="not JSON"):
        check_rest_body(b"[" * 100_000, {}, B)
    with pytest.raises(Malformed, match="beyond INT64"):
        check_rest_body(b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], '
                        b'"data": [99999999999999999999]}]}', {}, B)
    binary = b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 2], "parameters": {"binary_data_size": 16}}]}'
    check_rest_body(binary + bytes(16), {"inference-header-content-length": str(len(binary))}, B)
    with pytest.raises(Malformed, match="binary data of 16 bytes"):
        check_rest_body(binary + bytes(4096), {"inference-header-content-length": str(len(binary))}, B)
