"""Tests of the pure-Python reference ``cyattn.oracle`` on its own.

The oracle is the ground truth of the rest of the suite, so it is checked here on hand-computed
cases and on invariants, using only the standard library and pytest (no NumPy).
"""

import ast
import doctest
import importlib
import inspect
import math
import pathlib
import random
import sys

import pytest

from cyattn import oracle

NAN = math.nan
INF = math.inf


def _rounded(values, ndigits=3):
    if isinstance(values, list):
        return [_rounded(v, ndigits) for v in values]
    return round(values, ndigits)


def _close(a, b, rel=1e-12, abs_=1e-12):
    """Nested-list closeness; NaN matches NaN and infinities must match exactly."""
    if isinstance(a, list) or isinstance(b, list):
        return (
            isinstance(a, list)
            and isinstance(b, list)
            and len(a) == len(b)
            and all(_close(x, y, rel, abs_) for x, y in zip(a, b))
        )
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _random_matrix(rng, rows, cols, lo=-3.0, hi=3.0):
    return [[rng.uniform(lo, hi) for _ in range(cols)] for _ in range(rows)]


def _transpose(m):
    return [list(col) for col in zip(*m)]


def _is_all_nan(row):
    return all(math.isnan(v) for v in row)


# ------------------------------------------------------------------------------------------
# Hand-computed example
# ------------------------------------------------------------------------------------------


def test_three_score_softmax_hand_computed():
    weights = oracle.softmax([2.0, 1.0, 0.0])
    assert _rounded(weights) == [0.665, 0.245, 0.090]
    z = math.exp(2.0) + math.exp(1.0) + 1.0
    assert _close(weights, [math.exp(2.0) / z, math.exp(1.0) / z, 1.0 / z], rel=1e-15)


def test_three_score_attention_hand_computed():
    # E = 1, scale = 1: scores = q . k_j = [2, 1, 0]
    query = [[1.0]]
    key = [[2.0], [1.0], [0.0]]
    value = [[1.0, 0.0], [0.0, 2.0], [3.0, 1.0]]
    out, lse = oracle.scaled_dot_product_attention(query, key, value, scale=1.0, return_lse=True)
    assert _rounded(out) == [[0.935, 0.579]]
    assert _close(lse, [math.log(math.exp(2.0) + math.exp(1.0) + 1.0)], rel=1e-15)


def test_default_scale_is_one_over_sqrt_e():
    rng = random.Random(1)
    q, k, v = _random_matrix(rng, 2, 4), _random_matrix(rng, 3, 4), _random_matrix(rng, 3, 2)
    default = oracle.scaled_dot_product_attention(q, k, v)
    explicit = oracle.scaled_dot_product_attention(q, k, v, scale=0.5)
    assert default == explicit


# ------------------------------------------------------------------------------------------
# Softmax invariants
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 33])
def test_rows_sum_to_one(n):
    rng = random.Random(n)
    rows = _random_matrix(rng, 5, n, -50.0, 50.0)
    for row in oracle.softmax(rows):
        assert math.isclose(math.fsum(row), 1.0, rel_tol=0, abs_tol=4e-16 * n)
        assert all(0.0 <= w <= 1.0 for w in row)


@pytest.mark.parametrize("shift", [-1000.0, -3.5, 0.25, 7.0, 1e4])
def test_shift_invariance(shift):
    rng = random.Random(7)
    row = [rng.uniform(-5, 5) for _ in range(9)]
    shifted = [x + shift for x in row]
    assert _close(oracle.softmax(shifted), oracle.softmax(row), rel=1e-9, abs_=1e-15)
    assert _close(oracle.log_softmax(shifted), oracle.log_softmax(row), rel=1e-9, abs_=1e-9)


def test_large_scores_do_not_overflow():
    assert oracle.softmax([1000.0, 1000.0]) == [0.5, 0.5]
    assert oracle.softmax([-1000.0, -1000.0]) == [0.5, 0.5]
    assert oracle.softmax([1e308, 0.0]) == [1.0, 0.0]


def test_subnormal_weight_is_kept():
    w = oracle.softmax([0.0, -740.0])
    assert 0.0 < w[1] < sys.float_info.min  # subnormal, not flushed to zero


def test_log_softmax_matches_log_of_softmax():
    rng = random.Random(3)
    rows = _random_matrix(rng, 4, 6, -20.0, 20.0)
    expected = [[math.log(w) for w in row] for row in oracle.softmax(rows)]
    assert _close(oracle.log_softmax(rows), expected, rel=1e-12, abs_=1e-12)


def test_inputs_are_not_modified():
    x = [[1.0, 2.0], [3.0, NAN]]
    mask = [[True, False], [True, False]]
    snapshot = repr((x, mask))
    oracle.softmax(x, mask=mask)
    oracle.log_softmax(x, axis=0)
    assert repr((x, mask)) == snapshot


def test_int_data_is_accepted_bool_data_is_not():
    assert oracle.softmax([1, 1]) == [0.5, 0.5]
    with pytest.raises(TypeError, match="x holds True"):
        oracle.softmax([True, False])
    with pytest.raises(TypeError, match="expected real numbers"):
        oracle.softmax(["a", 1.0])


# ------------------------------------------------------------------------------------------
# Axis handling
# ------------------------------------------------------------------------------------------


def test_axis_zero_is_transpose_of_last_axis():
    rng = random.Random(11)
    x = _random_matrix(rng, 3, 5)
    by_columns = oracle.softmax(x, axis=0)
    assert by_columns == _transpose(oracle.softmax(_transpose(x), axis=-1))
    assert oracle.softmax(x, axis=-2) == by_columns
    assert oracle.softmax(x, axis=1) == oracle.softmax(x)
    assert oracle.log_softmax(x, axis=0) == _transpose(oracle.log_softmax(_transpose(x)))


def test_axis_middle_of_3d():
    rng = random.Random(12)
    x = [_random_matrix(rng, 3, 4) for _ in range(2)]
    result = oracle.softmax(x, axis=1)
    for b in range(2):
        assert result[b] == _transpose(oracle.softmax(_transpose(x[b])))
    mask = [[[(i + j + b) % 3 != 0 for j in range(4)] for i in range(3)] for b in range(2)]
    masked = oracle.softmax(x, axis=1, mask=mask)
    for b in range(2):
        expected = _transpose(oracle.softmax(_transpose(x[b]), mask=_transpose(mask[b])))
        assert masked[b] == expected


def test_one_dimensional_and_empty():
    assert oracle.softmax([3.0]) == [1.0]
    assert oracle.softmax([]) == []
    assert oracle.softmax([[], []]) == [[], []]
    assert oracle.softmax([[], []], axis=0) == [[], []]
    assert oracle.log_softmax([[]]) == [[]]


@pytest.mark.parametrize("axis", [2, -3, 5])
def test_axis_out_of_range(axis):
    with pytest.raises(ValueError, match="out of range"):
        oracle.softmax([[1.0, 2.0]], axis=axis)


def test_axis_type_and_scalar_x():
    with pytest.raises(TypeError, match="axis must be an int"):
        oracle.softmax([1.0], axis=0.0)
    with pytest.raises(ValueError, match="at least 1 dimension"):
        oracle.softmax(1.0)
    with pytest.raises(ValueError, match="ragged"):
        oracle.softmax([[1.0, 2.0], [3.0]])


# ------------------------------------------------------------------------------------------
# Mask semantics
# ------------------------------------------------------------------------------------------


def test_bool_mask_selects():
    x = [1.0, 5.0, 2.0, -1.0]
    mask = [True, False, True, True]
    w = oracle.softmax(x, mask=mask)
    sub = oracle.softmax([1.0, 2.0, -1.0])
    assert w == [sub[0], 0.0, sub[1], sub[2]]
    lw = oracle.log_softmax(x, mask=mask)
    sub_log = oracle.log_softmax([1.0, 2.0, -1.0])
    assert lw == [sub_log[0], -INF, sub_log[1], sub_log[2]]


def test_float_mask_is_added():
    x = [1.0, 5.0, 2.0]
    mask = [0.5, -2.0, 0.0]
    assert oracle.softmax(x, mask=mask) == oracle.softmax([1.5, 3.0, 2.0])
    assert oracle.log_softmax(x, mask=mask) == oracle.log_softmax([1.5, 3.0, 2.0])


def test_float_minus_inf_removes_a_position():
    w = oracle.softmax([1.0, 5.0, 2.0], mask=[0.0, -INF, 0.0])
    assert w == [oracle.softmax([1.0, 2.0])[0], 0.0, oracle.softmax([1.0, 2.0])[1]]
    assert oracle.log_softmax([1.0, 5.0], mask=[0.0, -INF]) == [0.0, -INF]


def test_finite_minus_1e9_does_not_mask():
    # every position shifted by the same finite amount: still a uniform, non-masked row
    assert _close(oracle.softmax([0.0, 0.0, 0.0], mask=[-1e9] * 3), [1 / 3] * 3, rel=1e-15)
    # -1e9 is plain arithmetic: it can be compensated by the score
    assert oracle.softmax([1e9, 0.0], mask=[-1e9, 0.0]) == [0.5, 0.5]
    # and in attention (float mask added after the scale)
    out = oracle.scaled_dot_product_attention(
        [[0.0]], [[0.0], [0.0]], [[1.0], [3.0]], attn_mask=[[-1e9, -1e9]]
    )
    assert out == [[2.0]]
    smallest = -sys.float_info.max
    assert oracle.softmax([0.0, 0.0], mask=[smallest, smallest]) == [0.5, 0.5]


def test_integer_and_mixed_masks_raise_type_error():
    with pytest.raises(TypeError, match="integer"):
        oracle.softmax([1.0, 2.0], mask=[1, 0])
    with pytest.raises(TypeError, match="mixes bool and float"):
        oracle.softmax([1.0, 2.0], mask=[True, 0.0])
    with pytest.raises(TypeError, match="integer"):
        oracle.scaled_dot_product_attention([[1.0]], [[1.0]], [[1.0]], attn_mask=[[1]])


def test_mask_shape_mismatch_raises():
    with pytest.raises(ValueError, match="same shape as x"):
        oracle.softmax([1.0, 2.0], mask=[True])
    with pytest.raises(ValueError, match="same shape as x"):
        oracle.softmax([[1.0, 2.0]], mask=[True, True])
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        oracle.scaled_dot_product_attention(
            [[1.0]], [[1.0], [2.0]], [[1.0], [2.0]], attn_mask=[[True]]
        )


# ------------------------------------------------------------------------------------------
# Fully masked rows, NaN and +inf
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "x, mask",
    [
        ([1.0, 2.0, 3.0], [False, False, False]),
        ([1.0, 2.0, 3.0], [-INF, -INF, -INF]),
        ([-INF, -INF, -INF], None),
        ([-INF, 2.0, -INF], [True, False, True]),
        ([NAN, INF, 3.0], [False, False, False]),  # nothing permitted is read
    ],
)
def test_fully_masked_softmax_rows(x, mask):
    assert oracle.softmax(x, mask=mask) == [0.0, 0.0, 0.0]
    assert oracle.log_softmax(x, mask=mask) == [-INF, -INF, -INF]


def test_fully_masked_row_among_others():
    x = [[1.0, 2.0], [3.0, 4.0]]
    mask = [[True, True], [False, False]]
    result = oracle.softmax(x, mask=mask)
    assert result[0] == oracle.softmax([1.0, 2.0])
    assert result[1] == [0.0, 0.0]


@pytest.mark.parametrize(
    "x, mask",
    [
        ([1.0, NAN, 2.0], None),
        ([1.0, INF, 2.0], None),
        ([INF, INF], None),
        ([1.0, 2.0], [0.0, NAN]),
        ([1.0, 2.0], [INF, 0.0]),
        ([NAN, 2.0, 1.0], [True, False, False]),
        ([-INF, NAN], None),
    ],
)
def test_nan_or_plus_inf_candidate_makes_row_nan(x, mask):
    assert _is_all_nan(oracle.softmax(x, mask=mask))
    assert _is_all_nan(oracle.log_softmax(x, mask=mask))


def test_nan_in_bool_masked_position_does_not_leak():
    w = oracle.softmax([1.0, NAN, 1.0, INF], mask=[True, False, True, False])
    assert w == [0.5, 0.0, 0.5, 0.0]


def test_attention_fully_masked_rows():
    q = [[1.0, 0.0], [0.0, 1.0]]
    k = [[1.0, 2.0], [3.0, 4.0]]
    v = [[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]]
    for mask in ([[True, True], [False, False]], [[0.0, 0.0], [-INF, -INF]]):
        out, lse = oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask, return_lse=True)
        assert out[1] == [0.0, 0.0, 0.0]
        assert lse[1] == -INF
        assert all(math.isfinite(x) for x in out[0]) and math.isfinite(lse[0])
    # the causal rule with bottom-right alignment and L > S empties the first rows
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0]] * 3, [[1.0]], [[4.0]], is_causal=True, causal_alignment="bottom_right",
        return_lse=True,
    )
    assert out == [[0.0], [0.0], [4.0]]
    assert lse == [-INF, -INF, 1.0]


def test_attention_nan_and_inf_rows():
    v = [[1.0], [2.0]]
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0], [1.0]], [[NAN], [1.0]], v, scale=1.0, return_lse=True
    )
    assert _is_all_nan(out[0]) and _is_all_nan(out[1]) and _is_all_nan(lse)
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0]], [[INF], [1.0]], v, scale=1.0, return_lse=True
    )
    assert _is_all_nan(out[0]) and math.isnan(lse[0])
    # a NaN in a permitted value makes the output NaN, but not the lse
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0]], [[1.0], [1.0]], [[NAN], [2.0]], return_lse=True
    )
    assert math.isnan(out[0][0]) and math.isfinite(lse[0])


def test_nan_in_bool_masked_key_or_value_does_not_leak():
    q = [[1.0, 1.0]]
    k = [[1.0, 0.0], [NAN, INF], [0.0, 1.0]]
    v = [[1.0, 2.0], [NAN, -INF], [3.0, 4.0]]
    out, lse = oracle.scaled_dot_product_attention(
        q, k, v, attn_mask=[[True, False, True]], return_lse=True
    )
    assert out == [[2.0, 3.0]]
    assert _close(lse, [1 / math.sqrt(2) + math.log(2.0)], rel=1e-15)
    # causally hidden keys are not read either
    out = oracle.scaled_dot_product_attention(
        [[1.0, 1.0]], [[1.0, 0.0], [NAN, NAN]], [[5.0, 6.0], [NAN, NAN]], is_causal=True
    )
    assert out == [[5.0, 6.0]]


def test_value_with_zero_weight_is_not_read():
    # a float -inf mask gives weight exactly 0: that value is skipped in the sum
    out = oracle.scaled_dot_product_attention(
        [[1.0]], [[1.0], [1.0]], [[2.0], [NAN]], attn_mask=[[0.0, -INF]]
    )
    assert out == [[2.0]]
    # so is one whose weight underflows to exactly 0
    out = oracle.scaled_dot_product_attention(
        [[1.0]], [[0.0], [-2000.0]], [[2.0], [INF]], scale=1.0
    )
    assert out == [[2.0]]


# ------------------------------------------------------------------------------------------
# Causal alignment, scale, empty dimensions
# ------------------------------------------------------------------------------------------


def test_causal_top_left_vs_bottom_right():
    q = [[1.0] * 3 for _ in range(2)]
    k = [[1.0] * 3 for _ in range(5)]
    v = [[0.0], [1.0], [2.0], [3.0], [4.0]]
    top_left = oracle.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert top_left == [[0.0], [0.5]]
    bottom_right = oracle.scaled_dot_product_attention(
        q, k, v, is_causal=True, causal_alignment="bottom_right"
    )
    assert bottom_right == [[1.5], [2.0]]
    assert oracle.scaled_dot_product_attention(q, k, v) == [[2.0], [2.0]]


def test_causal_and_bool_mask_compose_with_and():
    q = [[1.0]] * 3
    k = [[1.0]] * 3
    v = [[1.0], [10.0], [100.0]]
    mask = [[True, True, True], [False, True, True], [True, False, True]]
    out = oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert out == [[1.0], [10.0], [50.5]]


def test_bad_causal_alignment():
    with pytest.raises(ValueError, match="causal_alignment"):
        oracle.scaled_dot_product_attention([[1.0]], [[1.0]], [[1.0]], causal_alignment="left")


def test_scale_zero_is_honoured():
    q = [[1.0, 2.0]]
    k = [[3.0, -1.0], [10.0, 4.0], [0.0, 0.0], [-5.0, 2.0]]
    v = [[1.0], [2.0], [3.0], [6.0]]
    out, lse = oracle.scaled_dot_product_attention(q, k, v, scale=0.0, return_lse=True)
    assert out == [[3.0]]
    assert lse == [math.log(4.0)]


def test_scale_does_not_multiply_the_mask():
    q, k, v = [[1.0]], [[1.0], [1.0]], [[0.0], [1.0]]
    mask = [[0.0, math.log(3.0)]]
    out = oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.0)
    assert _close(out, [[0.75]], rel=1e-15)


def test_e_zero_gives_mean_of_v():
    q = [[], []]
    k = [[], [], []]
    v = [[1.0, 3.0], [2.0, 6.0], [6.0, 0.0]]
    out, lse = oracle.scaled_dot_product_attention(q, k, v, return_lse=True)
    assert out == [[3.0, 3.0], [3.0, 3.0]]
    assert lse == [math.log(3.0)] * 2
    # scores are 0 whatever the explicit scale
    assert oracle.scaled_dot_product_attention(q, k, v, scale=INF) == out


def test_s_zero_gives_zeros():
    out, lse = oracle.scaled_dot_product_attention(
        [[1.0, 2.0]] * 3, [], [], value_dim=4, return_lse=True
    )
    assert out == [[0.0] * 4] * 3
    assert lse == [-INF] * 3
    assert oracle.scaled_dot_product_attention([[1.0]], [], [], value_dim=0) == [[]]
    with pytest.raises(ValueError, match="value_dim"):
        oracle.scaled_dot_product_attention([[1.0]], [], [])


def test_l_zero_gives_empty():
    assert oracle.scaled_dot_product_attention([], [[1.0]], [[2.0]]) == []
    assert oracle.scaled_dot_product_attention([], [[1.0]], [[2.0]], return_lse=True) == ([], [])
    assert oracle.scaled_dot_product_attention([], [[1.0]], [[2.0]], attn_mask=[]) == []


def test_lse_is_log_sum_exp_of_scaled_scores():
    rng = random.Random(5)
    q, k, v = _random_matrix(rng, 3, 4), _random_matrix(rng, 6, 4), _random_matrix(rng, 6, 2)
    scale = 0.7
    _, lse = oracle.scaled_dot_product_attention(q, k, v, scale=scale, return_lse=True)
    for i in range(3):
        scores = [scale * math.fsum(a * b for a, b in zip(q[i], k[j])) for j in range(6)]
        assert math.isclose(lse[i], math.log(math.fsum(math.exp(s) for s in scores)),
                            rel_tol=1e-14)


def test_attention_equals_softmax_times_v():
    rng = random.Random(6)
    q, k, v = _random_matrix(rng, 4, 3), _random_matrix(rng, 5, 3), _random_matrix(rng, 5, 2)
    mask = [[rng.random() < 0.7 for _ in range(5)] for _ in range(4)]
    scale = 1 / math.sqrt(3)
    scores = [[scale * math.fsum(a * b for a, b in zip(qi, kj)) for kj in k] for qi in q]
    weights = oracle.softmax(scores, mask=mask)
    expected = [
        [math.fsum(w[j] * v[j][d] for j in range(5)) for d in range(2)] for w in weights
    ]
    out = oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert _close(out, expected, rel=1e-14, abs_=1e-15)


def test_batched_attention_matches_per_batch():
    rng = random.Random(8)
    q = [[_random_matrix(rng, 2, 3) for _ in range(3)] for _ in range(2)]
    k = [[_random_matrix(rng, 4, 3) for _ in range(3)] for _ in range(2)]
    v = [[_random_matrix(rng, 4, 5) for _ in range(3)] for _ in range(2)]
    m = [[[[rng.random() < 0.6 for _ in range(4)] for _ in range(2)] for _ in range(3)]
         for _ in range(2)]
    out, lse = oracle.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=True,
                                                   return_lse=True)
    for b in range(2):
        for h in range(3):
            o, l_ = oracle.scaled_dot_product_attention(
                q[b][h], k[b][h], v[b][h], attn_mask=m[b][h], is_causal=True, return_lse=True
            )
            assert out[b][h] == o and lse[b][h] == l_


def test_batched_attention_with_empty_inner_dims():
    # batch of 2 with L = 0: empty per-batch results
    assert oracle.scaled_dot_product_attention([[], []], [[[1.0]], [[2.0]]],
                                               [[[1.0]], [[2.0]]]) == [[], []]
    # batch of 2 with S = 0
    out = oracle.scaled_dot_product_attention([[[1.0]], [[2.0]]], [[], []], [[], []],
                                              value_dim=2)
    assert out == [[[0.0, 0.0]], [[0.0, 0.0]]]


def test_attention_shape_errors():
    with pytest.raises(ValueError, match="query has E=2 columns but key has 1"):
        oracle.scaled_dot_product_attention([[1.0, 2.0]], [[1.0]], [[1.0]])
    with pytest.raises(ValueError, match="key has 2 rows but value has 1"):
        oracle.scaled_dot_product_attention([[1.0]], [[1.0], [2.0]], [[1.0]])
    with pytest.raises(ValueError, match="identical leading batch dimensions"):
        oracle.scaled_dot_product_attention([[[1.0]]], [[[1.0]], [[1.0]]], [[[1.0]], [[1.0]]])


def test_attention_inputs_not_modified():
    q, k, v = [[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]], [[7.0], [8.0]]
    mask = [[True, False]]
    snapshot = repr((q, k, v, mask))
    oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert repr((q, k, v, mask)) == snapshot


# ------------------------------------------------------------------------------------------
# matmul_accumulate
# ------------------------------------------------------------------------------------------


def test_matmul_accumulate_small_integers_exact():
    a = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    b = [[7.0, 8.0], [9.0, 10.0], [11.0, 12.0]]
    out = [[1.0, -1.0], [0.5, 2.0]]
    result = oracle.matmul_accumulate(a, b, out)
    assert result == [[59.0, 63.0], [139.5, 156.0]]
    assert oracle.matmul_accumulate(a, b, out, alpha=-2.0) == [[-115.0, -129.0], [-277.5, -306.0]]
    assert oracle.matmul_accumulate(a, b, out, alpha=0.0) == out
    assert out == [[1.0, -1.0], [0.5, 2.0]]  # not modified


def test_matmul_accumulate_exact_sum():
    # naive left-to-right summation gives 0.0 here; fsum gives the exact 1.0
    a = [[1e16, 1.0, -1e16]]
    b = [[1.0], [1.0], [1.0]]
    assert oracle.matmul_accumulate(a, b, [[0.0]]) == [[1.0]]
    # intermediate overflow is not an error when the exact sum is finite
    a = [[1e308, 1e308, -1e308]]
    assert oracle.matmul_accumulate(a, b, [[0.0]]) == [[1e308]]
    assert oracle.matmul_accumulate([[1e308, 1e308]], [[1.0], [1.0]], [[0.0]]) == [[INF]]
    # inf - inf is NaN, as in IEEE arithmetic
    result = oracle.matmul_accumulate([[INF, -INF]], [[1.0], [1.0]], [[0.0]])
    assert math.isnan(result[0][0])


def test_matmul_accumulate_batched_and_empty():
    rng = random.Random(9)
    a = [[[float(rng.randint(-5, 5)) for _ in range(3)] for _ in range(2)] for _ in range(4)]
    b = [[[float(rng.randint(-5, 5)) for _ in range(2)] for _ in range(3)] for _ in range(4)]
    out = [[[float(rng.randint(-5, 5)) for _ in range(2)] for _ in range(2)] for _ in range(4)]
    result = oracle.matmul_accumulate(a, b, out, alpha=3.0)
    for i in range(4):
        assert result[i] == oracle.matmul_accumulate(a[i], b[i], out[i], alpha=3.0)
    # K = 0: out unchanged; M = 0: empty; N = 0: empty rows
    assert oracle.matmul_accumulate([[], []], [], [[1.0, 2.0], [3.0, 4.0]]) == [
        [1.0, 2.0], [3.0, 4.0]
    ]
    assert oracle.matmul_accumulate([], [[1.0, 2.0]], []) == []
    assert oracle.matmul_accumulate([[1.0]], [[]], [[]]) == [[]]


def test_matmul_accumulate_errors():
    with pytest.raises(ValueError, match="a has 2 columns but b has 3 rows"):
        oracle.matmul_accumulate([[1.0, 2.0]], [[1.0], [2.0], [3.0]], [[0.0]])
    with pytest.raises(ValueError, match="out has 2 rows but a has 1"):
        oracle.matmul_accumulate([[1.0]], [[1.0]], [[0.0], [0.0]])
    with pytest.raises(ValueError, match="b has 1 columns but out has 2"):
        oracle.matmul_accumulate([[1.0]], [[1.0]], [[0.0, 0.0]])
    with pytest.raises(ValueError, match="identical leading batch"):
        oracle.matmul_accumulate([[[1.0]]], [[[1.0]], [[1.0]]], [[[0.0]]])
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        oracle.matmul_accumulate(1.0, [[1.0]], [[0.0]])
    with pytest.raises(TypeError, match="alpha"):
        oracle.matmul_accumulate([[1.0]], [[1.0]], [[0.0]], alpha="2")


# ------------------------------------------------------------------------------------------
# multi_head_attention
# ------------------------------------------------------------------------------------------


def _mha_params(rng, embed_dim, kdim=None, vdim=None):
    kdim = embed_dim if kdim is None else kdim
    vdim = embed_dim if vdim is None else vdim
    return {
        "q_proj_weight": _random_matrix(rng, embed_dim, embed_dim, -1, 1),
        "k_proj_weight": _random_matrix(rng, embed_dim, kdim, -1, 1),
        "v_proj_weight": _random_matrix(rng, embed_dim, vdim, -1, 1),
        "in_proj_bias": [rng.uniform(-1, 1) for _ in range(3 * embed_dim)],
        "out_proj_weight": _random_matrix(rng, embed_dim, embed_dim, -1, 1),
        "out_proj_bias": [rng.uniform(-1, 1) for _ in range(embed_dim)],
    }


def _linear(x, w, b):
    return [[math.fsum([*(xi * wi for xi, wi in zip(row, wr)), bo]) for wr, bo in zip(w, b)]
            for row in x]


def _mha_problem(seed, E, L, S):
    """``(params, (query, key, value))`` of one self-contained MHA case, drawn from
    ``random.Random(seed)``: E-wide queries (L rows), keys and values (S rows)."""
    rng = random.Random(seed)
    p = _mha_params(rng, E)
    return p, (_random_matrix(rng, L, E), _random_matrix(rng, S, E), _random_matrix(rng, S, E))


def test_mha_single_head_is_projected_attention():
    rng = random.Random(21)
    E, L, S = 4, 3, 5
    p = _mha_params(rng, E, kdim=2, vdim=3)
    query = _random_matrix(rng, L, E)
    key = _random_matrix(rng, S, 2)
    value = _random_matrix(rng, S, 3)
    kpm = [False, True, False, False, False]
    out, weights = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                               key_padding_mask=kpm, is_causal=True)
    b = p["in_proj_bias"]
    q = _linear(query, p["q_proj_weight"], b[:E])
    k = _linear(key, p["k_proj_weight"], b[E:2 * E])
    v = _linear(value, p["v_proj_weight"], b[2 * E:])
    mask = [[not kpm[j] for j in range(S)] for _ in range(L)]
    attn = oracle.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    expected = _linear(attn, p["out_proj_weight"], p["out_proj_bias"])
    assert _close(out, expected, rel=1e-13, abs_=1e-14)
    scores = [[math.fsum(a * c for a, c in zip(qi, kj)) / 2.0 for kj in k] for qi in q]
    causal = [[mask[i][j] and j <= i for j in range(S)] for i in range(L)]
    assert _close(weights, oracle.softmax(scores, mask=causal), rel=1e-13, abs_=1e-15)
    assert weights[0] == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_mha_in_proj_weight_equals_separate_weights():
    E = 4
    p, (query, key, value) = _mha_problem(22, E, 3, 2)
    packed = dict(p)
    packed["in_proj_weight"] = p["q_proj_weight"] + p["k_proj_weight"] + p["v_proj_weight"]
    for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
        del packed[name]
    a = oracle.multi_head_attention(query, key, value, num_heads=2, **p)
    b = oracle.multi_head_attention(query, key, value, num_heads=2, **packed)
    assert a == b


def test_mha_heads_and_weight_averaging():
    E, H, L, S = 6, 3, 2, 4
    p, (query, key, value) = _mha_problem(23, E, L, S)
    out, per_head = oracle.multi_head_attention(query, key, value, num_heads=H, **p,
                                                average_attn_weights=False)
    out2, averaged = oracle.multi_head_attention(query, key, value, num_heads=H, **p)
    out3, none = oracle.multi_head_attention(query, key, value, num_heads=H, **p,
                                             need_weights=False)
    assert out == out2 == out3 and none is None
    assert len(per_head) == H and all(len(w) == L and len(w[0]) == S for w in per_head)
    expected = [[math.fsum(per_head[h][i][j] for h in range(H)) / H for j in range(S)]
                for i in range(L)]
    assert averaged == expected
    # per-head check against single-head attention on the projected slices
    b = p["in_proj_bias"]
    q = _linear(query, p["q_proj_weight"], b[:E])
    k = _linear(key, p["k_proj_weight"], b[E:2 * E])
    v = _linear(value, p["v_proj_weight"], b[2 * E:])
    d = E // H
    heads = [
        oracle.scaled_dot_product_attention([r[h * d:(h + 1) * d] for r in q],
                                            [r[h * d:(h + 1) * d] for r in k],
                                            [r[h * d:(h + 1) * d] for r in v])
        for h in range(H)
    ]
    concat = [[x for h in range(H) for x in heads[h][i]] for i in range(L)]
    assert _close(out, _linear(concat, p["out_proj_weight"], p["out_proj_bias"]), rel=1e-13,
                  abs_=1e-14)


def test_mha_mask_polarity_and_float_masks():
    E, L, S = 2, 2, 3
    p, (query, key, value) = _mha_problem(24, E, L, S)
    ignore_last = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                              key_padding_mask=[False, False, True])
    as_float = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                           key_padding_mask=[0.0, 0.0, -INF])
    as_attn_mask = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                               attn_mask=[[False, False, True]] * L)
    assert ignore_last == as_float == as_attn_mask
    assert all(row[2] == 0.0 for row in ignore_last[1])
    # 3-D attn_mask: one mask per head
    per_head = [[[False, False, True]] * L, [[True, False, False]] * L]
    _, w = oracle.multi_head_attention(query, key, value, num_heads=2, **p,
                                       attn_mask=per_head, average_attn_weights=False)
    assert all(row[2] == 0.0 for row in w[0]) and all(row[0] == 0.0 for row in w[1])
    # two float masks are summed
    _, w1 = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                        key_padding_mask=[0.5, 0.0, 0.0],
                                        attn_mask=[[0.0, 1.0, 0.0]] * L)
    _, w2 = oracle.multi_head_attention(query, key, value, num_heads=1, **p,
                                        attn_mask=[[0.5, 1.0, 0.0]] * L)
    assert _close(w1, w2, rel=1e-15)


def test_mha_fully_masked_row_gives_bias_not_nan():
    E, L, S = 4, 2, 3
    p, (query, key, value) = _mha_problem(25, E, L, S)
    attn_mask = [[True, True, True], [False, True, True]]
    out, w = oracle.multi_head_attention(query, key, value, num_heads=2, **p, attn_mask=attn_mask)
    assert w[0] == [0.0, 0.0, 0.0]
    assert _close(out[0], p["out_proj_bias"], rel=1e-15)  # zero attention, projected: the bias
    assert math.isclose(math.fsum(w[1]), 1.0, rel_tol=1e-15)
    assert all(math.isfinite(x) for row in out for x in row)


def test_mha_errors():
    rng = random.Random(26)
    p = _mha_params(rng, 4)
    q = _random_matrix(rng, 2, 4)
    with pytest.raises(ValueError, match="divisible by num_heads=3"):
        oracle.multi_head_attention(q, q, q, num_heads=3, **p)
    with pytest.raises(ValueError, match="num_heads must be positive"):
        oracle.multi_head_attention(q, q, q, num_heads=0, **p)
    with pytest.raises(TypeError, match="num_heads must be an int"):
        oracle.multi_head_attention(q, q, q, num_heads=2.0, **p)
    with pytest.raises(ValueError, match="not both"):
        oracle.multi_head_attention(q, q, q, num_heads=2, **p,
                                    in_proj_weight=_random_matrix(rng, 12, 4))
    bad = dict(p)
    del bad["v_proj_weight"]
    with pytest.raises(ValueError, match="all required"):
        oracle.multi_head_attention(q, q, q, num_heads=2, **bad)
    with pytest.raises(ValueError, match="key_padding_mask must have shape"):
        oracle.multi_head_attention(q, q, q, num_heads=2, **p, key_padding_mask=[True])
    with pytest.raises(ValueError, match="attn_mask must have shape"):
        oracle.multi_head_attention(q, q, q, num_heads=2, **p, attn_mask=[[True]])
    with pytest.raises(ValueError, match="unbatched"):
        oracle.multi_head_attention([q], [q], [q], num_heads=2, **p)
    with pytest.raises(ValueError, match="query must have 4 columns"):
        oracle.multi_head_attention([[1.0]], q, q, num_heads=2, **p)


# ------------------------------------------------------------------------------------------
# The oracle itself
# ------------------------------------------------------------------------------------------


def _oracle_modules():
    """The package ``cyattn.oracle`` and each of its modules (found on disk, so none is missed)."""
    folder = pathlib.Path(oracle.__file__).parent
    names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert names, "expected the oracle's modules beside its __init__.py"
    return [oracle] + [importlib.import_module(f"cyattn.oracle.{name}") for name in names]


def test_oracle_imports_only_the_standard_library():
    imported = set()
    for module in _oracle_modules():
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level:
                # a relative import may only reach the oracle's own modules, not the rest of cyattn
                assert node.level == 1, f"{module.__name__} imports from outside the oracle"
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module.split(".")[0])
    assert "math" in imported, "expected at least the math import"
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_oracle_doctests():
    attempted = 0
    for module in _oracle_modules():
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, module.__name__
        attempted += result.attempted
    assert attempted > 0


def test_public_names():
    assert sorted(oracle.__all__) == sorted([
        "softmax", "log_softmax", "matmul_accumulate", "scaled_dot_product_attention",
        "multi_head_attention",
    ])
    for name in oracle.__all__:
        doc = getattr(oracle, name).__doc__
        assert "Returns" in doc and "Raises" in doc
