"""Pure-Python reference implementation of cyattn (the test suite's ground truth).

This package re-implements every public computation of cyattn -- masked row softmax and log-softmax,
``out + alpha * (a @ b)``, scaled dot-product attention and multi-head attention -- with nothing but
the Python standard library: nested lists of Python floats, :func:`math.exp`, :func:`math.log` and
:func:`math.fsum`. It is written for clarity, not speed, and every sum is an exactly rounded
:func:`math.fsum`, so its results are the most accurate float64 values the formulas allow. The
compiled kernels are tested against it.

Inputs are nested lists (or tuples) of Python numbers; ``x.tolist()`` of a NumPy array is the
intended way to build them. Data entries may be ``float`` or ``int`` (converted to float); ``bool``
data is a ``TypeError``. Masks hold either only ``bool`` or only ``float`` values; an integer mask
entry is a ``TypeError``. Results are new nested lists of Python floats; inputs are never modified.

Semantics (identical to the compiled kernels)
---------------------------------------------
Row softmax of scores ``s_j``:

* bool mask: True = take part. A masked (False) position is never read and gets weight exactly 0.
* float mask: added to the scores (``s_j = x_j + mask_j``); ``-inf`` removes a position; finite
  values, even ``-1e9``, are plain arithmetic and do not mask.
* The *candidates* are the permitted positions. If any candidate score is NaN or ``+inf``, the whole
  row is NaN.
* Else, if there is no candidate or every candidate score is ``-inf``, the row is *fully masked*:
  weights all 0, log-softmax all ``-inf``, attention output 0, lse ``-inf``. No NaN, no warning;
  the same holds without a mask.
* Else ``m = max(candidates)``, ``e_j = exp(s_j - m)``, ``Z = fsum(e_j)``, ``w_j = e_j / Z`` (0 for
  non-candidates) and ``log_softmax_j = s_j - m - log(Z)`` (``-inf`` for non-candidates).

Attention, per query row ``i`` (one head):

* Key ``j`` is permitted if the bool mask is True there (when a bool mask is given) and, with
  ``is_causal``, ``j <= i + off`` with ``off = 0`` for ``causal_alignment="top_left"`` and
  ``off = S - L`` for ``"bottom_right"``.
* ``s_j = scale * fsum(q_i * k_j)`` for permitted ``j`` only (plus the float mask value when the
  mask is float). Non-permitted keys are never read. ``scale`` defaults to ``1 / sqrt(E)``; when
  ``E == 0`` the scores are 0 and the default scale is 1.0 (the result is the mean of V). An
  explicit scale, even 0.0, is honoured and multiplies ``Q K^T`` only, never the mask.
* ``w`` is the row softmax above, ``out_i = fsum(w_j * v_j)`` over the ``j`` with ``w_j != 0`` (a
  key whose weight is exactly 0 is never read, so NaN/inf in masked values cannot leak), and
  ``lse_i = m + log(Z)`` (``-inf`` for a fully masked row, NaN for a NaN row).
* ``S == 0`` is a fully masked row (zeros); ``L == 0`` gives an empty result.

Attention variants (keyword arguments of :func:`scaled_dot_product_attention`; without them the
results are exactly the above). Per batch entry ``b``: ``K_b = min(key_lengths[b], S)`` (S when
not given), ``L_b = min(query_lengths[b], L)`` (L when not given), and the *aligned position*
of query row ``i`` is ``p(i) = i`` for ``"top_left"`` and ``p(i) = i + K_b - L_b`` for
``"bottom_right"`` (``i + S - L`` without lengths, the rule above).

* Key ``j`` is permitted iff ``j < K_b``, the causal rule ``j <= p(i)`` (with ``is_causal``),
  the window rule ``p(i) - left <= j <= p(i) + right`` (with ``window=(left, right)``, ``None``
  = unbounded side) and the bool mask all permit it.
* Rows ``i >= L_b`` give output 0 and lse ``-inf`` (also with sinks).
* Score of a permitted key: ``s = scale * q.k``; with ``softcap=c``: ``s = c * tanh(s / c)``;
  with ALiBi slope ``a``: ``s = s + (-a) * |p(i) - j|``; then the float mask is added.
* A sink logit ``t`` joins the denominator with no value: ``m' = max(m, t)``,
  ``Z = fsum(exp(s_j - m')) + exp(t - m')``, ``w_j = exp(s_j - m') / Z``, ``lse = m' + log(Z)``.
  A row with no candidate (or all ``-inf``) gives output 0 and lse ``t``; ``t = -inf`` has no
  effect; ``t = +inf`` gives output 0 and lse ``+inf`` unless a candidate is NaN or ``+inf``
  (row NaN); a NaN sink makes the row NaN.

Source: Vaswani et al. 2017, "Attention Is All You Need" (scaled dot-product and multi-head
attention). Variants: Beltagy et al. 2020 (Longformer) and Jiang et al. 2023 (Mistral 7B) for
sliding windows, Gemma Team 2024 (Gemma 2) for the logit softcap, Press et al. 2022 (ALiBi),
OpenAI 2025 (gpt-oss) and Xiao et al. 2024 (attention sinks) for sinks.

Layout
------
``_common.py`` (nested-list helpers, exact sums, the row softmax, validation helpers),
``softmax.py`` (:func:`softmax`, :func:`log_softmax`), ``matmul.py`` (:func:`matmul_accumulate`),
``attention.py`` (:func:`scaled_dot_product_attention` and its variants) and ``mha.py``
(:func:`multi_head_attention`). This file re-exports the public names.

Notes
-----
Empty nested lists do not carry their full shape (``[]`` may be ``(0,)`` or ``(0, 5)``). The oracle
reads the shape from the nesting and the other arguments; in the rare case where a batched call has
empty inner dimensions that make the 2-D reading inconsistent, it retries the call as batched.
"""

from .attention import scaled_dot_product_attention
from .matmul import matmul_accumulate
from .mha import multi_head_attention
from .softmax import log_softmax, softmax

__all__ = [
    "softmax",
    "log_softmax",
    "matmul_accumulate",
    "scaled_dot_product_attention",
    "multi_head_attention",
]
