"""cyattn's attention on PyTorch CPU tensors, with ``torch.nn.functional``'s signature.

Needs ``torch`` (``pip install cyattn[torch]``); ``import cyattn`` never imports this module.
Inputs are viewed as NumPy arrays without a copy (``Tensor.numpy()`` shares the buffer;
bfloat16 tensors as ``ml_dtypes.bfloat16`` arrays when ml_dtypes is installed) and the result is
returned as a tensor on the NumPy result's buffer (``torch.from_numpy``), or written into a
caller's tensor with ``out=``.
"""
from __future__ import annotations

import inspect
import numbers

import numpy as np
import torch

from .attention import scaled_dot_product_attention as _core_sdpa

__all__ = ["scaled_dot_product_attention", "core_options"]

_FNAME = "cyattn.torch.scaled_dot_product_attention"
_NUMPY_DTYPES = (torch.float32, torch.float64, torch.float16)
_DTYPES = _NUMPY_DTYPES + (torch.bfloat16,)
_CORE_PARAMETERS = frozenset(inspect.signature(_core_sdpa).parameters)


def _numpy_bfloat16():
    try:
        import ml_dtypes
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


_BF16 = _numpy_bfloat16()      # None: bfloat16 tensors go through float32 copies


def core_options():
    """The keyword options that this build's :func:`cyattn.scaled_dot_product_attention` has.

    Returns
    -------
    frozenset of str
        Parameter names, e.g. ``"softcap" in cyattn.torch.core_options()`` tells whether the
        core supports logit soft-capping.
    """
    return _CORE_PARAMETERS


def _check_tensor(t, name):
    """``t`` detached, after checking that it is a dense CPU tensor that needs no gradient."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{_FNAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{_FNAME}: {name} is on device {str(t.device)!r}; cyattn runs on CPU "
                         f"tensors only (move it with .cpu(), or use "
                         f"torch.nn.functional.scaled_dot_product_attention on that device)")
    if t.layout is not torch.strided:
        raise TypeError(f"{_FNAME}: {name} has layout {t.layout}; expected a dense "
                        f"(torch.strided) tensor")
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{_FNAME}: {name} requires grad and grad mode is on, but cyattn has no "
                         f"backward pass; run inference under torch.no_grad() or "
                         f"torch.inference_mode(), and use "
                         f"torch.nn.functional.scaled_dot_product_attention for training")
    return t.detach()


def _to_numpy(t):
    """A NumPy view of the CPU tensor ``t`` (bfloat16: an ``ml_dtypes.bfloat16`` view of its
    buffer, or without ml_dtypes a float32 copy; NumPy itself has no bfloat16)."""
    if t.dtype is torch.bfloat16:
        if _BF16 is not None:
            return t.view(torch.int16).numpy().view(_BF16)
        t = t.float()
    elif t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t.numpy()


def _from_numpy(arr):
    """A tensor sharing ``arr``'s buffer (``ml_dtypes.bfloat16`` arrays as torch.bfloat16)."""
    if _BF16 is not None and arr.dtype == _BF16:
        return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def _pack_heads(arr, group):
    """The view ``(..., H // group, group, X)`` of ``arr`` of shape ``(..., H, 1, X)``."""
    *outer, heads, _, last = arr.shape
    packed = arr.reshape(tuple(outer) + (heads // group, group, last))  # splits an axis: a view
    if packed.size == 0 or np.may_share_memory(packed, arr):
        return packed
    *outer_strides, head_stride, _, last_stride = arr.strides
    return np.lib.stride_tricks.as_strided(
        arr, tuple(outer) + (heads // group, group, last),
        tuple(outer_strides) + (head_stride * group, head_stride, last_stride),
        writeable=arr.flags.writeable)


def _optional_array(x, name):
    """A tensor option (mask, sinks, slopes, lengths) as NumPy; other values unchanged."""
    if x is None or not isinstance(x, torch.Tensor):
        return x
    return _to_numpy(_check_tensor(x, name))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *,
                                 causal_alignment="top_left", window=None, softcap=None,
                                 sinks=None, alibi_slopes=None, key_lengths=None,
                                 query_lengths=None, return_lse=False, out=None,
                                 n_threads=None, precision=None):
    r"""Scaled dot-product attention ``softmax(scale * query @ key^T + mask) @ value`` on CPU
    tensors, a drop-in for ``torch.nn.functional.scaled_dot_product_attention`` in inference.

    The positional parameters and their defaults are PyTorch's; the keyword-only options are
    those of :func:`cyattn.scaled_dot_product_attention`, to which this function hands NumPy
    views of the tensors.

    Parameters
    ----------
    query : torch.Tensor, shape (..., L, E)
    key : torch.Tensor, shape (..., S, E)
    value : torch.Tensor, shape (..., S, Ev)
        CPU tensors of one dtype: float32, float64, float16 or bfloat16, any strides (e.g. the
        ``transpose(1, 2)`` head views of a projection). Batch dimensions broadcast.
    attn_mask : torch.Tensor of bool or float, optional
        Broadcastable to ``(..., L, S)``. bool: True = the query may attend to the key
        (PyTorch's polarity); float (any float dtype): added to the scaled scores, ``-inf``
        removes a position.
    dropout_p : float, optional
        Must be 0.0: cyattn has no dropout (it is an inference kernel).
    is_causal : bool, optional
        Restrict query ``i`` to keys ``j <= i`` (top-left aligned, as PyTorch; see
        ``causal_alignment``). With ``attn_mask`` both apply (AND), as torch 2.13 on CPU does.
    scale : float, optional
        Multiplies ``query @ key^T``; default ``1 / sqrt(E)``.
    enable_gqa : bool, optional
        Grouped-query attention: ``key``/``value`` may have fewer heads (axis -3), dividing the
        query's; query head ``h`` reads key/value head ``h // (Hq // Hkv)``. No copy is made.
    causal_alignment, window, softcap, sinks, alibi_slopes, key_lengths, query_lengths : options
        Keyword-only, passed to :func:`cyattn.scaled_dot_product_attention` (tensors as NumPy
        arrays). The options other than ``causal_alignment`` are
        passed only when given, and raise TypeError when this build's core does not have them
        (see :func:`core_options`).
    return_lse : bool, keyword-only
        Also return the log-sum-exp of each row's scaled, masked scores, shape ``(..., L)``.
    out : torch.Tensor, keyword-only, optional
        CPU tensor of shape ``(..., L, Ev)`` and the query's dtype, any strides (e.g. the
        ``(B, H, L, Ev)`` view ``buf.transpose(1, 2)`` of a ``(B, L, H, Ev)`` buffer), that
        receives the output; it is returned.
    n_threads : int, keyword-only, optional
        Threads of the kernel; default ``torch.get_num_threads()``.
    precision : {None, "exact", "fast"}, keyword-only, optional
        bfloat16 tensors: passed to :func:`cyattn.scaled_dot_product_attention` when given.
        The default (None) is the core's: ``"fast"`` (bf16 dot products, the weights rounded
        to bfloat16 before ``P V``, as PyTorch's own bf16 SDPA does) where the kernels have
        AVX512-BF16, else ``"exact"``.

    Returns
    -------
    output : torch.Tensor, shape (..., L, Ev), the query's dtype
        ``out`` if given, else a tensor sharing the memory of the kernel's NumPy result.
    lse : torch.Tensor, shape (..., L)
        Only with ``return_lse=True``.

    Raises
    ------
    TypeError
        If ``query``, ``key``, ``value`` or ``out`` is not a tensor, they differ in dtype or
        have a dtype other than float32, float64, float16 and bfloat16, a tensor is not dense,
        ``dropout_p`` is not a real number, a variant option is given that this build's core
        does not have, or the core raises TypeError (mask dtype, option types).
    ValueError
        If a tensor is not on the CPU (CUDA, meta, ...), ``dropout_p`` is not 0, a tensor
        requires grad while grad mode is on (no backward: use PyTorch's function for
        training), ``out`` has the wrong shape or dtype, or the core raises ValueError
        (shapes, masks, options).

    Notes
    -----
    Zero copy: float32 and float64 tensors are read in place and the output is written by the
    kernel straight into a fresh buffer or ``out``, when ``out`` is C-contiguous or has rows of
    adjacent elements (e.g. a (B, L, H, Ev) tensor transposed to (B, H, L, Ev)) and shares no
    memory with the inputs; another ``out`` gets one copy of the result. float16 and
    bfloat16 (which NumPy lacks; viewed as ``ml_dtypes.bfloat16`` arrays, so ml_dtypes must be
    installed for this, else they go through float32 copies) are handed to the core as they
    are: it computes in float32 and rounds once to the half format. The decode path (at most
    16 query rows) reads half-precision keys and values in place, the fused path widens them
    block by block (see :func:`cyattn.scaled_dot_product_attention`). bfloat16 prefill (more
    than 16 query rows) runs on the CPU's bf16 dot products by default where it has them
    (``precision``; the contract and error bound are the core's).

    A fully masked row (no permitted key) gives zeros, as PyTorch 2.13's CPU kernels do.
    ``is_causal`` with ``attn_mask`` composes by AND, as PyTorch 2.13 on CPU computes it
    (older PyTorch versions raised).

    Source: Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (eq. 1); the kernel is
    described in :func:`cyattn.scaled_dot_product_attention`.

    Examples
    --------
    >>> import torch, cyattn.torch
    >>> q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    >>> o = cyattn.torch.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> bool(torch.allclose(o, ref, atol=1e-6))
    True
    """
    query = _check_tensor(query, "query")
    key = _check_tensor(key, "key")
    value = _check_tensor(value, "value")
    dtype = query.dtype
    if key.dtype != dtype or value.dtype != dtype:
        raise TypeError(f"{_FNAME}: query, key and value must have the same dtype, got "
                        f"{query.dtype}, {key.dtype} and {value.dtype}")
    if dtype not in _DTYPES:
        raise TypeError(f"{_FNAME}: query has dtype {dtype}; expected torch.float32, "
                        f"torch.float64, torch.float16 or torch.bfloat16")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"{_FNAME}: dropout_p must be a real number, got "
                        f"{type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"{_FNAME}: dropout_p must be 0.0 (cyattn is an inference kernel, "
                         f"without dropout), got {dropout_p}; use "
                         f"torch.nn.functional.scaled_dot_product_attention for training")
    # the "variants" options are passed only when given: a core without them would reject None
    options = {}
    for name, val in (("window", window), ("softcap", softcap), ("sinks", sinks),
                      ("alibi_slopes", alibi_slopes), ("key_lengths", key_lengths),
                      ("query_lengths", query_lengths), ("precision", precision)):
        if val is None:
            continue
        if name not in _CORE_PARAMETERS:
            raise TypeError(f"{_FNAME}: {name}= needs a cyattn whose "
                            f"cyattn.scaled_dot_product_attention has the {name!r} option; "
                            f"this build's has none")
        options[name] = _optional_array(val, name)
    if n_threads is None:
        n_threads = torch.get_num_threads()
    out_np = None
    out_given = out
    if out is not None:
        out = _check_tensor(out, "out")
        if out.dtype != dtype:
            raise ValueError(f"{_FNAME}: out has dtype {out.dtype}; expected the query's "
                             f"dtype {dtype}")
        if dtype is not torch.bfloat16 or _BF16 is not None:
            out_np = _to_numpy(out)
    q_np, k_np, v_np = _to_numpy(query), _to_numpy(key), _to_numpy(value)
    mask_np = _optional_array(attn_mask, "attn_mask")
    packed = None
    if (enable_gqa is True and is_causal is False and not options and q_np.ndim >= 3
            and k_np.ndim >= 3 and q_np.shape[-2] == 1 and k_np.shape[-3] > 0
            and q_np.shape[-3] != k_np.shape[-3] and q_np.shape[-3] % k_np.shape[-3] == 0
            and (not isinstance(mask_np, np.ndarray) or mask_np.ndim < 3
                 or mask_np.shape[-3] in (1, q_np.shape[-3]))):
        # One query row per head (a decode step): the query heads sharing a key/value head
        # become the rows of one problem, so each key/value head is read once, not once per
        # query head (transformers' pack_gqa). Views only; the result reshapes back.
        heads, group = q_np.shape[-3], q_np.shape[-3] // k_np.shape[-3]
        packed = q_np.shape[:-3] + (heads, 1)
        q_np = _pack_heads(q_np, group)
        if isinstance(mask_np, np.ndarray) and mask_np.ndim >= 3 and mask_np.shape[-3] == heads:
            mask_np = _pack_heads(mask_np, group)
        if out_np is not None:
            out_np = _pack_heads(out_np, group)
        enable_gqa = False
    res = _core_sdpa(q_np, k_np, v_np, mask_np, is_causal, scale,
                     causal_alignment=causal_alignment, enable_gqa=enable_gqa,
                     return_lse=return_lse, out=out_np, n_threads=n_threads, **options)
    res, lse = res if return_lse else (res, None)
    if packed is not None:
        res = res.reshape(packed + res.shape[-1:])
        lse = None if lse is None else lse.reshape(packed)
    if out is not None:
        if out_np is None:          # bfloat16 without ml_dtypes: round the float32 result once
            if tuple(out.shape) != res.shape:
                raise ValueError(f"{_FNAME}: out has shape {tuple(out.shape)}; expected "
                                 f"{res.shape}")
            out.copy_(torch.from_numpy(res))
        result = out_given
    else:
        result = _from_numpy(res)
        if result.dtype is not dtype:           # bfloat16 from a float32 result
            result = result.to(dtype)
    if not return_lse:
        return result
    lse = _from_numpy(lse)
    return result, (lse if lse.dtype is dtype else lse.to(dtype))
