"""Multi-head attention of the oracle (torch.nn.MultiheadAttention parity, unbatched)."""

import math
import numbers

from ._common import _flatten, _is_seq, _mask_kind, _matrix, _nested_shape, _shape, _sum, _vector
from .attention import _attend, _qkv_matrices


def _linear(x_rows, weight_rows, bias):
    """``x W^T + b`` with each output element summed exactly (bias included in the sum)."""
    return [
        [
            _sum([x[c] * w[c] for c in range(len(x))] + [bias[o]])
            for o, w in enumerate(weight_rows)
        ]
        for x in x_rows
    ]


def multi_head_attention(
    query,
    key,
    value,
    *,
    num_heads,
    in_proj_weight=None,
    in_proj_bias=None,
    out_proj_weight,
    out_proj_bias=None,
    q_proj_weight=None, k_proj_weight=None, v_proj_weight=None,
    key_padding_mask=None,
    attn_mask=None,
    need_weights=True,
    average_attn_weights=True,
    is_causal=False,
):
    """Multi-head attention ``concat_h(softmax(Q_h K_h^T / sqrt(d) + mask) V_h) W_o^T + b_o``.

    **Masks use torch.nn.MultiheadAttention's polarity: a bool ``key_padding_mask`` or
    ``attn_mask`` entry True means IGNORE that key** (the opposite of
    :func:`scaled_dot_product_attention`). Float masks are added to the scaled scores.

    Unbatched only (torch's 2-D inputs); loop over the batch for batched inputs.

    Parameters
    ----------
    query : nested list of float, shape (L, E)
    key : nested list of float, shape (S, kdim)
    value : nested list of float, shape (S, vdim)
    num_heads : int
        Number of heads H; ``E % H == 0``, head_dim ``d = E // H``, scale ``1 / sqrt(d)``
        (1.0 when ``d == 0``).
    in_proj_weight : nested list of float, shape (3E, E), optional
        Rows ``[W_q; W_k; W_v]`` (requires ``kdim == vdim == E``). Give either this or all three
        of ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight``.
    in_proj_bias : list of float, shape (3E,), optional
        ``[b_q; b_k; b_v]``; zeros when None.
    out_proj_weight : nested list of float, shape (E, E)
    out_proj_bias : list of float, shape (E,), optional
        Zeros when None.
    q_proj_weight, k_proj_weight, v_proj_weight : nested lists of float, optional
        Shapes (E, E), (E, kdim), (E, vdim), used when ``in_proj_weight`` is None.
    key_padding_mask : list of bool or of float, shape (S,), optional
        bool: True = ignore the key; float: added to the scores of every query and head.
    attn_mask : nested list of bool or of float, shape (L, S) or (H, L, S), optional
        bool: True = ignore; float: added. A 3-D mask gives one (L, S) mask per head.
    need_weights : bool, default True
        Return the attention weights.
    average_attn_weights : bool, default True
        Average the weights over the heads (else return them per head).
    is_causal : bool, default False
        Also restrict query ``i`` to keys ``j <= i`` (top-left), composed by AND with the masks.

    Returns
    -------
    out : list, shape (L, E)
    weights : list or None
        None if not ``need_weights``; shape (L, S) if ``average_attn_weights`` (the fsum over the
        heads divided by H), else (H, L, S).

    Raises
    ------
    ValueError
        If the shapes are inconsistent, ``num_heads`` is not a positive divisor of E, neither or
        both of ``in_proj_weight`` and the separate projection weights are given, or a mask has
        the wrong shape.
    TypeError
        If ``num_heads`` is not an int, an entry is not a real number (or is a bool), or a mask
        holds integers or mixes bool and float.

    Notes
    -----
    Two float masks are summed first (``attn_mask + key_padding_mask``) and then added to the
    scaled scores. A row in which every key of a head is removed is fully masked: that head's
    weights and output are 0 (so the final output row is ``out_proj_bias`` when all heads are
    fully masked), never NaN. Projections are summed exactly (:func:`math.fsum`, bias included).
    Source: Vaswani et al. 2017, section 3.2.2.

    Examples
    --------
    >>> out, w = multi_head_attention([[1.0]], [[1.0], [1.0]], [[2.0], [4.0]], num_heads=1,
    ...                               in_proj_weight=[[1.0], [1.0], [1.0]],
    ...                               out_proj_weight=[[1.0]])
    >>> out, w
    ([[3.0]], [[0.5, 0.5]])
    >>> multi_head_attention([[1.0]], [[1.0], [1.0]], [[2.0], [4.0]], num_heads=1,
    ...                      in_proj_weight=[[1.0], [1.0], [1.0]], out_proj_weight=[[1.0]],
    ...                      key_padding_mask=[False, True])[0]
    [[2.0]]
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, numbers.Integral):
        raise TypeError(f"num_heads must be an int; got {num_heads!r}")
    if num_heads <= 0:
        raise ValueError(f"num_heads must be positive; got {num_heads}")
    num_heads = int(num_heads)

    if not _is_seq(out_proj_weight):
        raise ValueError(
            "out_proj_weight must be a 2-D nested list (E, E); got "
            f"{type(out_proj_weight).__name__}"
        )
    embed_dim = len(out_proj_weight)
    w_out = _matrix(out_proj_weight, "out_proj_weight", rows=embed_dim, cols=embed_dim)
    if embed_dim % num_heads != 0:
        raise ValueError(
            f"embed_dim E={embed_dim} (from out_proj_weight) must be divisible by "
            f"num_heads={num_heads}"
        )
    head_dim = embed_dim // num_heads

    if _is_seq(query) and len(_shape(query, "query")) >= 3:
        raise ValueError(
            f"query must be unbatched (L, E); got shape {_shape(query, 'query')}; call once per "
            "batch element"
        )
    q_in, k_in, v_in = _qkv_matrices(query, key, value, embed_dim, widths=("kdim", "vdim"))
    n_queries, n_keys = len(q_in), len(k_in)

    separate = (q_proj_weight, k_proj_weight, v_proj_weight)
    if in_proj_weight is not None:
        if any(w is not None for w in separate):
            raise ValueError(
                "give either in_proj_weight or q_proj_weight/k_proj_weight/v_proj_weight, "
                "not both"
            )
        w_in = _matrix(in_proj_weight, "in_proj_weight", rows=3 * embed_dim, cols=embed_dim)
        w_q = w_in[:embed_dim]
        w_k = w_in[embed_dim:2 * embed_dim]
        w_v = w_in[2 * embed_dim:]
        k_dim = v_dim = embed_dim
    else:
        if any(w is None for w in separate):
            raise ValueError(
                "in_proj_weight is None, so q_proj_weight, k_proj_weight and v_proj_weight "
                "are all required"
            )
        w_q = _matrix(q_proj_weight, "q_proj_weight", rows=embed_dim, cols=embed_dim)
        w_k = _matrix(k_proj_weight, "k_proj_weight", rows=embed_dim)
        w_v = _matrix(v_proj_weight, "v_proj_weight", rows=embed_dim)
        k_dim = len(w_k[0]) if embed_dim else (len(k_in[0]) if n_keys else 0)
        v_dim = len(w_v[0]) if embed_dim else (len(v_in[0]) if n_keys else 0)
    if n_keys and len(k_in[0]) != k_dim:
        raise ValueError(f"key must have kdim={k_dim} columns; got {len(k_in[0])}")
    if n_keys and len(v_in[0]) != v_dim:
        raise ValueError(f"value must have vdim={v_dim} columns; got {len(v_in[0])}")

    if in_proj_bias is None:
        b_in = [0.0] * (3 * embed_dim)
    else:
        b_in = _vector(in_proj_bias, "in_proj_bias", 3 * embed_dim)
    b_out = [0.0] * embed_dim if out_proj_bias is None else _vector(
        out_proj_bias, "out_proj_bias", embed_dim
    )

    # Masks -> per head: keep[h][i][j] (bool, True = take part) and add[h][i][j] (float).
    keep = [[[True] * n_keys for _ in range(n_queries)] for _ in range(num_heads)]
    add = [[[0.0] * n_keys for _ in range(n_queries)] for _ in range(num_heads)]
    any_float = False
    attn_add = None  # float attn_mask per head, summed with the float key_padding_mask below
    if attn_mask is not None:
        mask_shape = _nested_shape(attn_mask, "attn_mask", "a nested list")
        if mask_shape == (num_heads, n_queries, n_keys) and len(mask_shape) == 3:
            per_head = [attn_mask[h] for h in range(num_heads)]
        elif mask_shape == (n_queries, n_keys) or (n_queries == 0 and mask_shape == (0,)):
            per_head = [attn_mask] * num_heads
        elif n_queries == 0 and mask_shape == (num_heads, 0):
            per_head = [[]] * num_heads
        else:
            raise ValueError(
                f"attn_mask must have shape (L, S) = ({n_queries}, {n_keys}) or "
                f"(num_heads, L, S) = ({num_heads}, {n_queries}, {n_keys}); got {mask_shape}"
            )
        if _mask_kind(_flatten(attn_mask), "attn_mask") == "bool":
            for h in range(num_heads):
                for i in range(n_queries):
                    for j in range(n_keys):
                        if per_head[h][i][j]:
                            keep[h][i][j] = False
        else:
            any_float = True
            attn_add = [[[float(v) for v in row] for row in per_head[h]] for h in range(num_heads)]
    kpm_add = None
    if key_padding_mask is not None:
        kpm_shape = _nested_shape(key_padding_mask, "key_padding_mask", "a list of shape (S,)")
        if kpm_shape != (n_keys,):
            raise ValueError(
                f"key_padding_mask must have shape (S,) = ({n_keys},); got {kpm_shape}"
            )
        if _mask_kind(key_padding_mask, "key_padding_mask") == "bool":
            for h in range(num_heads):
                for i in range(n_queries):
                    for j in range(n_keys):
                        if key_padding_mask[j]:
                            keep[h][i][j] = False
        else:
            any_float = True
            kpm_add = [float(v) for v in key_padding_mask]
    if any_float:
        for h in range(num_heads):
            for i in range(n_queries):
                for j in range(n_keys):
                    if attn_add is not None and kpm_add is not None:
                        add[h][i][j] = attn_add[h][i][j] + kpm_add[j]
                    elif attn_add is not None:
                        add[h][i][j] = attn_add[h][i][j]
                    else:
                        add[h][i][j] = kpm_add[j]

    q_proj = _linear(q_in, w_q, b_in[:embed_dim])
    k_proj = _linear(k_in, w_k, b_in[embed_dim:2 * embed_dim])
    v_proj = _linear(v_in, w_v, b_in[2 * embed_dim:])

    scale = 1.0 / math.sqrt(head_dim) if head_dim else 1.0
    head_outputs, head_weights = [], []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        out_h, _, weights_h = _attend(
            [row[cols] for row in q_proj],
            [row[cols] for row in k_proj],
            [row[cols] for row in v_proj],
            head_dim,
            scale,
            keep=keep[h],
            add=add[h] if any_float else None,
            causal_offset=0 if is_causal else None,
        )
        head_outputs.append(out_h)
        head_weights.append(weights_h)

    concat = [
        [v for h in range(num_heads) for v in head_outputs[h][i]] for i in range(n_queries)
    ]
    out = _linear(concat, w_out, b_out)

    if not need_weights:
        return out, None
    if not average_attn_weights:
        return out, head_weights
    averaged = [
        [
            _sum(head_weights[h][i][j] for h in range(num_heads)) / num_heads
            for j in range(n_keys)
        ]
        for i in range(n_queries)
    ]
    return out, averaged
