"""cyattn as an attention implementation of Hugging Face ``transformers`` models.

::

    import cyattn.transformers
    cyattn.transformers.register()          # call before building the model
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="cyattn")

Needs ``torch`` and ``transformers`` (``pip install cyattn[transformers]``); ``import cyattn``
never imports this module.
"""
from __future__ import annotations

import importlib
import inspect
import re
import warnings

import torch

from .torch import core_options, scaled_dot_product_attention as _torch_sdpa

__all__ = ["register", "attention_forward", "mask_function", "uses_attention_interface"]

_FNAME = "cyattn.transformers"
_warned_output_attentions = False
MAX_WEIGHTS = 1 << 24        # output_attentions: largest B * H * L * S returned (64 MiB float32)
_interface_by_config_class = {}


def uses_attention_interface(config):
    """Whether the model family of ``config`` runs its attention through transformers'
    ``AttentionInterface`` (and so through cyattn when ``attn_implementation="cyattn"``).

    Reads the source of the family's ``modeling_*`` module, as transformers itself does to
    decide whether a model's attention implementation can be set: a module that defines an
    ``*Attention*(nn.Module)`` class must call ``ALL_ATTENTION_FUNCTIONS.get_interface(``.
    Families whose module cannot be found (custom code) are assumed to use it.

    Parameters
    ----------
    config : transformers.PretrainedConfig

    Returns
    -------
    bool
    """
    cls = type(config)
    known = _interface_by_config_class.get(cls)
    if known is not None:
        return known
    modeling_name = cls.__module__.replace(".configuration_", ".modeling_")
    uses = True
    if modeling_name != cls.__module__:
        try:
            code = inspect.getsource(importlib.import_module(modeling_name))
        except (ImportError, OSError, TypeError):
            code = None
        if code is not None and re.search(r"^class \w*Attention\w*\(nn\.Module\):", code,
                                          re.MULTILINE):
            uses = "ALL_ATTENTION_FUNCTIONS.get_interface(" in code
    _interface_by_config_class[cls] = uses
    return uses


def mask_function(*args, config=None, **kwargs):
    """transformers' SDPA mask function (``masking_utils.sdpa_mask``), registered for cyattn.

    The masks are the ones ``attn_implementation="sdpa"`` gets: a bool tensor
    ``(batch, 1, L, S)`` with True = take part, or None where a plain causal or full mask can
    be inferred (see :func:`attention_forward`). Before building a mask it refuses model
    families whose attention does not go through the ``AttentionInterface`` (Bloom, MPT):
    they would run their own attention code with masks built for another one.

    Parameters
    ----------
    *args, **kwargs
        Those of ``transformers.masking_utils.sdpa_mask``.
    config : transformers.PretrainedConfig, optional
        The model's config (transformers passes it).

    Returns
    -------
    torch.Tensor of bool, shape (batch, 1, L, S), or None

    Raises
    ------
    ValueError
        If ``config`` belongs to a model family that does not use the ``AttentionInterface``.
    """
    from transformers.masking_utils import sdpa_mask
    if config is not None and not uses_attention_interface(config):
        raise ValueError(
            f"{_FNAME}: {type(config).__name__} models compute attention in their own code, "
            f"not through transformers' AttentionInterface, so attn_implementation="
            f"{getattr(config, '_attn_implementation', None)!r} cannot run them correctly; "
            f"build this model with attn_implementation='sdpa' or 'eager'")
    return sdpa_mask(*args, **kwargs)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, position_bias=None, **kwargs):
    r"""Attention of one transformers layer computed by cyattn, following the contract of
    transformers' ``sdpa_attention_forward`` (``integrations/sdpa_attention.py``).

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer; ``module.is_causal`` (default True) is read when ``is_causal`` is
        None.
    query : torch.Tensor, shape (B, H, L, E)
    key : torch.Tensor, shape (B, Hkv, S, E)
    value : torch.Tensor, shape (B, Hkv, S, Ev)
        CPU tensors of the model's dtype. ``Hkv`` may divide ``H`` (GQA): query head ``h`` reads
        key/value head ``h // (H // Hkv)``, without the copy ``repeat_kv`` makes. bfloat16
        models run prefill (L > 16) on the CPU's bf16 dot products where the kernels have them
        (:func:`cyattn.scaled_dot_product_attention`'s default ``precision``; P is rounded to
        bfloat16 before ``P V``, as torch's own bf16 SDPA does).
    attention_mask : torch.Tensor of bool or float, shape (B or 1, 1 or H, L, S), or None
        bool: True = take part (transformers' SDPA masks); float: added to the scores.
    dropout : float
        Must be 0.0 (``model.eval()``).
    scaling : float, optional
        Multiplies ``query @ key^T``; default ``1 / sqrt(E)``.
    is_causal : bool, optional
        Causal attention is used only when L > 1 and no mask is given (top-left aligned; the
        keys beyond the first L are then dropped, as SDPA does with an empty static cache); it
        is never composed with a given mask, and a single query (L = 1) attends to all keys.
    position_bias : torch.Tensor, shape (B or 1, H, L, S), optional
        T5's relative position bias, added to the scores (masked positions removed).
    **kwargs
        ``sliding_window`` (int W: in a causal layer whose bool mask ends with the window's
        pattern, the kernel also gets ``window=(W - 1, 0)`` aligned bottom-right, so that it
        skips the key blocks outside the window; the mask already holds the window),
        ``softcap`` (Gemma 2: scores ``c * tanh(s / c)``), ``s_aux`` (gpt-oss: one sink logit
        per head in the softmax denominator), ``output_attentions`` (the weights are returned,
        computed with torch ops, when ``B * H * L * S <= MAX_WEIGHTS``; above, None and a
        warning the first time). Others are ignored, as SDPA ignores them.

    Returns
    -------
    output : torch.Tensor, shape (B, L, H, Ev), contiguous
        Written by the kernel through ``out=`` into the tensor's buffer.
    weights : torch.Tensor, shape (B, H, L, S), or None
        Only with ``output_attentions=True`` (see above); rows with no permitted key are 0.

    Raises
    ------
    TypeError
        If ``softcap`` or ``s_aux`` is given and this build's core lacks the option, or for the
        reasons of :func:`cyattn.torch.scaled_dot_product_attention`.
    ValueError
        If ``dropout`` is not 0, the tensors are not on the CPU, they require grad with grad
        mode on, or for the other reasons of :func:`cyattn.torch.scaled_dot_product_attention`.

    Notes
    -----
    Differences from SDPA are limited to rows with no permitted key (padding queries): cyattn
    gives them zeros where SDPA's float masks built with ``finfo.min`` give an average of the
    values. Only non-padded rows take part in what the model returns.
    """
    q_length = query.shape[2]
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    causal_layer = bool(is_causal)
    is_causal = bool(q_length > 1 and attention_mask is None and is_causal)
    if is_causal and key.shape[2] > q_length:
        # an empty static cache's slots past the prompt: top-left causal never reads them
        key = key[:, :, :q_length]
        value = value[:, :, :q_length]
        if position_bias is not None:
            position_bias = position_bias[..., :q_length]
    mask = attention_mask
    if position_bias is not None:
        if mask is None:
            mask = position_bias                 # is_causal composes with it in the kernel
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, position_bias, float("-inf"))
        else:
            mask = position_bias + mask
    options = {}
    softcap = kwargs.get("softcap")
    if softcap is not None:
        options["softcap"] = float(softcap)
    sinks = kwargs.get("s_aux")
    if sinks is not None:
        options["sinks"] = sinks
    sliding_window = kwargs.get("sliding_window")
    if (sliding_window is not None and causal_layer and "window" in core_options()
            and _mask_has_window(mask, int(sliding_window))):
        options["window"] = (int(sliding_window) - 1, 0)
        options["causal_alignment"] = "bottom_right"
    batch = max(query.shape[0], key.shape[0])
    heads = query.shape[1]
    out = torch.empty((batch, q_length, heads, value.shape[-1]), dtype=query.dtype)
    _torch_sdpa(query, key, value, mask, dropout, is_causal, scaling,
                enable_gqa=key.shape[1] != heads, out=out.transpose(1, 2), **options)
    weights = None
    if kwargs.get("output_attentions", False):
        weights = _weights_if_small(query, key, mask, is_causal, scaling, softcap, sinks)
    return out, weights


def _mask_has_window(mask, window):
    """Whether the kernel may also get ``window=(window - 1, 0)`` aligned bottom-right: the
    bool mask of a causal layer whose last query sees the last key (keys are consecutive
    positions ending at the last query's, as in dynamic and full sliding caches) and none of
    the keys before the window, and the window removes keys (S > window). Checks the last row
    only (O(B * S)); the window then skips the blocks the mask removes without reading it.
    Models that pass the config's sliding_window to every layer while some layers get full
    causal masks fail the check, and bidirectional layers (ModernBERT) are excluded by the
    caller."""
    if mask is None or mask.dtype != torch.bool or mask.shape[-1] <= window:
        return False
    last = mask[..., -1, :]
    return bool(last[..., -1].all()) and not bool(last[..., :mask.shape[-1] - window].any())


def _weights_if_small(query, key, mask, is_causal, scaling, softcap, sinks):
    """The softmax weights (B, H, L, S) for output_attentions, computed with torch ops in
    float32 (float64 for float64) as the kernel defines them, when they have at most
    MAX_WEIGHTS elements; else None, with a warning the first time."""
    global _warned_output_attentions
    B, H, L, E = query.shape
    S = key.shape[2]
    if max(B, key.shape[0]) * H * L * S > MAX_WEIGHTS:
        if not _warned_output_attentions:
            _warned_output_attentions = True
            warnings.warn(f"{_FNAME}: output_attentions=True: the attention weights "
                          f"({max(B, key.shape[0])} x {H} x {L} x {S}) exceed {MAX_WEIGHTS} "
                          f"elements and are not returned (the kernel never forms them); "
                          f"build the model with attn_implementation='eager' to get them",
                          stacklevel=3)
        return None
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    k = key.to(dtype).repeat_interleave(H // key.shape[1], dim=1)
    scores = query.to(dtype) @ k.transpose(-1, -2)
    scores = scores * (scaling if scaling is not None else 1.0 / E ** 0.5)
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if is_causal:
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.to(dtype)
    if sinks is not None:
        sink = sinks.to(dtype).reshape(1, -1, 1, 1).expand(scores.shape[0], -1, L, 1)
        scores = torch.cat([scores, sink], dim=-1)
    row_max = scores.amax(dim=-1, keepdim=True)
    dead = torch.isneginf(row_max)                     # fully masked rows: weights 0
    weights = torch.exp(scores - torch.where(dead, 0.0, row_max))
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    weights = torch.where(dead, 0.0, weights)
    if sinks is not None:
        weights = weights[..., :-1]
    return weights.to(query.dtype)


_BUILTIN = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flash_attention_4",
            "flex_attention", "paged|eager")


def register(name="cyattn"):
    """Make ``attn_implementation=name`` run transformers models' attention on cyattn.

    Registers :func:`attention_forward` with ``transformers.AttentionInterface`` and
    :func:`mask_function` (transformers' SDPA mask function) with
    ``transformers.masking_utils.AttentionMaskInterface`` under the same name; without the
    mask registration transformers would give every layer no mask at all. Call it **before
    building the model**: transformers checks the name when the model is built. Calling it again
    is harmless.

    Parameters
    ----------
    name : str, optional
        The ``attn_implementation`` name, default ``"cyattn"``.

    Returns
    -------
    str
        ``name``.

    Raises
    ------
    TypeError
        If ``name`` is not a str.
    ValueError
        If ``name`` is empty or is one of transformers' own implementations ("sdpa", "eager",
        "flash_attention_2", ...), or is already registered to another function.

    Examples
    --------
    >>> import cyattn.transformers
    >>> cyattn.transformers.register()
    'cyattn'
    >>> # SentenceTransformer(path, model_kwargs={"attn_implementation": "cyattn"})
    """
    if not isinstance(name, str):
        raise TypeError(f"{_FNAME}.register: name must be a str, got {type(name).__name__}")
    if not name or name in _BUILTIN:
        raise ValueError(f"{_FNAME}.register: name must be a new, non-empty attention "
                         f"implementation name, got {name!r} (transformers' own names "
                         f"{', '.join(_BUILTIN)} are not replaced)")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    for interface, fn in ((AttentionInterface, attention_forward),
                          (AttentionMaskInterface, mask_function)):
        current = interface._global_mapping.get(name)
        if current is not None and current is not fn:
            raise ValueError(f"{_FNAME}.register: {name!r} is already registered with "
                             f"transformers.{interface.__name__} to {current!r}; choose another "
                             f"name")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, mask_function)
    return name
