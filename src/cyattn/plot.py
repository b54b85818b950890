"""Heatmaps of attention weights and masks (matplotlib; the optional extra ``cyattn[plot]``).

:func:`attention_heatmap` draws one head's (L, S) weights, :func:`attention_heads` one panel per
head on a shared colour scale, and :func:`mask_pattern` which keys each query may see under a
mask, a causal alignment or a window, without any data. Positions a mask removes are drawn in
``masked_color``, never in a colormap colour, so a removed key is told apart from a permitted
key whose weight is ~0; rows with no visible key are marked on the y-axis with ``∅`` in red.

These plots are diagnostics: they show what attention did (did padding leak, is the causal
diagonal where it should be, did a window cut the context, is a row fully masked). They are
not an explanation of a prediction: a high weight says that a query row drew on a key's value
in this layer and head, not that the key caused the output.

The functions return matplotlib objects and never call ``plt.show()``; they work with any
backend, including Agg on servers. Weights come from :func:`cyattn.attention_weights`.
"""
import math
import numbers

import numpy as np

try:
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize, to_rgba
    from matplotlib.font_manager import FontProperties
except ImportError as exc:                                   # pragma: no cover
    raise ImportError("cyattn.plot needs matplotlib >= 3.5: pip install 'cyattn[plot]' (or "
                      "pip install matplotlib)") from exc

__all__ = ["attention_heatmap", "attention_heads", "mask_pattern", "mask_kinds_figure"]

_ALIGNMENTS = ("top_left", "bottom_right")
_MAX_TICKS = 40              # labels per axis before they are thinned to every k-th
_EMPTY_ROW = "\u2205"        # the empty-set sign marks a fully masked row's tick label
_EMPTY_ROW_COLOR = "tab:red"
_LABEL_GAP = 1.25            # tick label pitch along an axis / the label's font height


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------

def _weights_array(weights, fname, ndims):
    try:
        w = np.asarray(weights)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{fname}: weights could not be converted to an array ({exc})") from None
    if w.dtype.kind not in "fiu" or w.dtype == np.bool_:
        raise TypeError(f"{fname}: weights has dtype {w.dtype}; expected a real (float) array")
    if w.ndim not in ndims:
        dims = {2: "(L, S)", 3: "(H, L, S)", 4: "(B, H, L, S)"}
        expected = " or ".join(f"{n}-D {dims[n]}" for n in ndims)
        raise ValueError(f"{fname}: weights must be {expected}, got shape {w.shape}")
    return w.astype(np.float64)


def _labels(labels, n, name, axis_name, fname):
    if labels is None:
        return None
    if isinstance(labels, str):
        raise TypeError(f"{fname}: {name} must be a sequence of labels, got a str")
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ValueError(f"{fname}: {name} has {len(labels)} labels; expected {n} (the "
                         f"{axis_name} of the weights)")
    return labels


def _window(window, fname):
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"{fname}: window must be a pair (left, right) of non-negative ints or "
                         f"None, got {window!r}")
    sides = []
    for side, value in zip(("left", "right"), window):
        if value is None:
            sides.append(None)
            continue
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{fname}: window {side} must be a non-negative int or None, got "
                            f"{type(value).__name__}")
        if value < 0:
            raise ValueError(f"{fname}: window {side} must be >= 0 or None, got {value}")
        sides.append(int(value))
    return tuple(sides)


def _keep(shape, attn_mask, is_causal, causal_alignment, window, fname, name="mask",
          target="the weights'"):
    """Bool array of ``shape`` (..., L, S): True where a key is visible to a query.

    ``attn_mask``: bool (True = take part) or float (``-inf`` removes), broadcast to ``shape``;
    ``is_causal``/``causal_alignment`` and ``window`` as in scaled_dot_product_attention (a
    window's key j is visible to query i iff ``p(i) - left <= j <= p(i) + right``, ``p(i) = i``
    for top_left and ``i + S - L`` for bottom_right). All compose by AND."""
    L, S = shape[-2:]
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"{fname}: is_causal must be a bool, got {type(is_causal).__name__}")
    if causal_alignment not in _ALIGNMENTS:
        raise ValueError(f"{fname}: causal_alignment must be 'top_left' or 'bottom_right', got "
                         f"{causal_alignment!r}")
    window = _window(window, fname)
    keep = np.ones(shape, dtype=bool)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.dtype == np.bool_:
            m_keep = m
        elif m.dtype.kind == "f":
            m_keep = m != -np.inf
        else:
            raise TypeError(f"{fname}: {name} has dtype {m.dtype}; expected bool (True = take "
                            f"part) or float (-inf removes a position)")
        try:
            together = np.broadcast_shapes(m.shape, shape)
        except ValueError:
            together = None
        if together != tuple(shape):
            raise ValueError(f"{fname}: {name} has shape {m.shape}, which does not broadcast to "
                             f"{target} {tuple(shape)}")
        keep &= m_keep
    pos = np.arange(L)[:, None] + ((S - L) if causal_alignment == "bottom_right" else 0)
    j = np.arange(S)[None, :]
    if is_causal:
        keep &= j <= pos
    if window is not None:
        left, right = window
        if left is not None:
            keep &= j >= pos - left
        if right is not None:
            keep &= j <= pos + right
    return keep


# --------------------------------------------------------------------------------------------
# drawing
# --------------------------------------------------------------------------------------------

def _axis_inches(ax, axis):
    """Length in inches of the ``axis`` ("x" or "y") side of ``ax``."""
    box = ax.get_position()
    width, height = ax.figure.get_size_inches()
    return box.width * width if axis == "x" else box.height * height


def _tick_budget(ax, axis, pitch):
    """How many tick labels ``pitch`` inches apart fit along ``axis`` of ``ax`` (2 to 40)."""
    return max(2, min(_MAX_TICKS, int(_axis_inches(ax, axis) / pitch)))


def _ticks(n, labels, budget, forced=()):
    """Tick positions and texts: every position when ``n <= budget``, else every k-th (for
    index labels a round k: 2, 5, 10, 20, ...); the ``forced`` rows are shown too (those
    less than k apart thinned the same way), in place of the grid ticks next to them."""
    step = 1
    if n > budget:
        step = math.ceil(n / budget)
        if labels is None:
            step = min(b * 10 ** e for e in range(19) for b in (1, 2, 5) if b * 10 ** e >= step)
    kept = []                   # forced rows at least a step apart, replacing grid ticks
    for r in sorted(int(i) for i in forced):
        if not kept or r - kept[-1] >= step:
            kept.append(r)
    pos = sorted({p for p in range(0, n, step) if all(abs(p - r) >= step for r in kept)}
                 | set(kept))
    texts = [labels[i] if labels is not None else str(i) for i in pos]
    return pos, texts


def _draw(ax, w, keep, norm, cmap, masked_color, nan_color, query_labels, key_labels, title,
          fontsize=None):
    """One (L, S) panel: colormap colours where ``keep``, ``masked_color`` elsewhere; tick
    labels of ``fontsize`` points (default: the rcParams size), thinned to fit."""
    L, S = w.shape
    if fontsize is not None:
        ax.tick_params(labelsize=fontsize)
    size = FontProperties(size=fontsize if fontsize is not None
                          else matplotlib.rcParams["ytick.labelsize"]).get_size_in_points()
    pitch = _LABEL_GAP * size / 72.0
    cmap = matplotlib.colormaps[cmap] if isinstance(cmap, str) else cmap
    rgba = cmap(norm(np.where(np.isfinite(w), w, 0.0)))
    rgba[np.isnan(w)] = to_rgba(nan_color)
    rgba[~keep] = to_rgba(masked_color)
    if L and S:
        ax.imshow(rgba, aspect="auto", interpolation="nearest", origin="upper",
                  extent=(-0.5, S - 0.5, L - 0.5, -0.5))
    # fully masked: the mask removes every key, or (no mask said so) the weights are all 0;
    # with S = 0 every row is (all() of an empty row is True)
    empty = ~keep.any(axis=1) | (np.nan_to_num(w, nan=1.0) == 0).all(axis=1)
    empty_rows = set(np.flatnonzero(empty).tolist())
    if empty_rows:      # red marks on the y-axis, whether or not the row's label is shown
        rows = sorted(empty_rows)
        ax.plot(np.full(len(rows), -0.5), rows, linestyle="none", marker=">",
                markersize=max(3.0, min(8.0, 72 * _axis_inches(ax, "y") / L)),
                color=_EMPTY_ROW_COLOR, clip_on=False, zorder=3, gid="fully_masked_rows")
    ypos, ytexts = _ticks(L, query_labels, _tick_budget(ax, "y", pitch), empty_rows)
    ax.set_yticks(ypos)
    ax.set_yticklabels([f"{_EMPTY_ROW} {t}" if p in empty_rows else t
                        for p, t in zip(ypos, ytexts)])
    for p, tick in zip(ypos, ax.get_yticklabels()):
        if p in empty_rows:
            tick.set_color(_EMPTY_ROW_COLOR)
    # token labels stand rotated; index labels stay level, as far apart as they are wide
    rotate = key_labels is not None and (S > 12 or max(map(len, key_labels), default=0) > 3)
    level_pitch = pitch * (0.7 + 0.6 * len(str(max(S - 1, 0))))
    xpos, xtexts = _ticks(S, key_labels, _tick_budget(ax, "x", pitch if rotate else level_pitch))
    ax.set_xticks(xpos)
    ax.set_xticklabels(xtexts, rotation=90 if rotate else 0)
    small = max(L, S) <= 24
    if small:       # cell borders, so that single masked cells stand out
        ax.set_xticks(np.arange(-0.5, S, 1.0), minor=True)
        ax.set_yticks(np.arange(-0.5, L, 1.0), minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title is not None:
        ax.set_title(title)
    ax.set_xlim(-0.5, max(S, 1) - 0.5)       # an empty side still gets one (blank) cell
    ax.set_ylim(max(L, 1) - 0.5, -0.5)
    return empty_rows


def attention_heatmap(weights, *, mask=None, query_labels=None, key_labels=None, ax=None,
                      title=None, masked_color="lightgrey", cmap="viridis", is_causal=False,
                      causal_alignment="top_left", window=None, vmax=None, nan_color="red",
                      colorbar=True):
    """Heatmap of one head's attention weights, masked positions in ``masked_color``.

    Query rows run top to bottom and keys left to right, as the matrix reads; the image
    fills the Axes. A position that the mask, the causal rule or the window removes is drawn
    in ``masked_color``; every other position gets its weight's colormap colour (a permitted
    weight of ~0 is the colormap's low end, not ``masked_color``). A row with no visible key
    (or, when nothing says so, all weights 0) is marked on the y-axis: its tick label is
    shown (even when the labels are thinned), prefixed by ``∅`` and red.

    A heatmap is a diagnostic of what attention did, not an explanation of a prediction: a
    high weight is not a cause.

    Parameters
    ----------
    weights : array_like of float, shape (L, S)
        One head's weights, e.g. ``cyattn.attention_weights(q, k, ...)[b, h]``.
    mask : array_like of bool or float, optional
        Broadcastable to (L, S). bool: True = take part (the convention of
        :func:`cyattn.scaled_dot_product_attention`); float: ``-inf`` removes a position.
    query_labels, key_labels : sequence of str, optional
        One label per query row (L) / key (S), e.g. the tokens. Key labels are rotated when
        long or many; more than 40 labels on an axis are thinned to every k-th.
    ax : matplotlib.axes.Axes, optional
        Axes to draw in; default a new figure (``plt.figure()``, not shown).
    title : str, optional
    masked_color : matplotlib colour, optional
        Colour of removed positions (default "lightgrey").
    cmap : str or matplotlib.colors.Colormap, optional
        Colormap of the weights (default "viridis").
    is_causal : bool, optional
        Also remove the keys the causal rule removes (key j visible to query i iff
        ``j <= p(i)``).
    causal_alignment : {"top_left", "bottom_right"}, optional
        ``p(i) = i`` (top_left) or ``i + S - L`` (bottom_right), as in attention.
    window : (int or None, int or None), optional
        Also remove keys outside ``p(i) - left <= j <= p(i) + right`` (None = unbounded).
    vmax : float, optional
        Top of the colour scale (default: the largest visible finite weight, or 1 when
        there is none); the bottom is 0.
    nan_color : matplotlib colour, optional
        Colour of NaN weights at visible positions (default "red").
    colorbar : bool, optional
        Draw a colorbar beside the Axes (default True).

    Returns
    -------
    matplotlib.axes.Axes
        The Axes drawn in.

    Raises
    ------
    TypeError
        If ``weights`` is not a real array, ``mask`` is neither bool nor float, a label list
        is a str, ``is_causal`` is not a bool, or a window side is not an int or None.
    ValueError
        If ``weights`` is not 2-D (use :func:`attention_heads` for several heads), a label
        count does not match L or S, ``mask`` does not broadcast to (L, S),
        ``causal_alignment`` is unknown or ``window`` is not a pair of non-negative ints or
        None.
    ImportError
        When this module is imported without matplotlib.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, cyattn, cyattn.plot
    >>> q = np.random.default_rng(0).standard_normal((4, 8))
    >>> w = cyattn.attention_weights(q, q, is_causal=True)
    >>> ax = cyattn.plot.attention_heatmap(w, is_causal=True, key_labels=list("abcd"))
    >>> ax.get_xlabel()
    'key'
    """
    f = "cyattn.plot.attention_heatmap"
    w = _weights_array(weights, f, (2,))
    L, S = w.shape
    query_labels = _labels(query_labels, L, "query_labels", "L = weights.shape[0]", f)
    key_labels = _labels(key_labels, S, "key_labels", "S = weights.shape[1]", f)
    keep = _keep(w.shape, mask, is_causal, causal_alignment, window, f)
    norm = _norm(w, keep, vmax)
    if ax is None:
        ax = plt.figure(figsize=_figsize(L, S), layout="constrained").add_subplot()
    _draw(ax, w, keep, norm, cmap, masked_color, nan_color, query_labels, key_labels, title)
    if colorbar:
        ax.figure.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, label="weight")
    return ax


def _figsize(L, S):
    """A figure size in inches that gives cells of about 0.3 inch, within 3-12 inches."""
    return (min(12.0, max(3.0, 2.0 + 0.3 * S)), min(12.0, max(3.0, 1.5 + 0.3 * L)))


def _norm(w, keep, vmax):
    if vmax is None:
        visible = w[keep & np.isfinite(w)]
        vmax = float(visible.max()) if visible.size and visible.max() > 0 else 1.0
    return Normalize(vmin=0.0, vmax=float(vmax))


def attention_heads(weights, *, batch_index=0, mask=None, query_labels=None, key_labels=None,
                    heads=None, ncols=None, title=None, masked_color="lightgrey",
                    cmap="viridis", is_causal=False, causal_alignment="top_left", window=None,
                    vmax=None, nan_color="red", panel_size=2.6):
    """A figure with one heatmap per head on a shared colour scale, and one colorbar.

    Each panel is drawn as by :func:`attention_heatmap` (query rows top to bottom, removed
    positions in ``masked_color``, fully masked rows marked ``∅`` in red); the panels form a
    grid of ``ncols`` columns. Like every plot here it is a diagnostic, not an explanation:
    a high weight is not a cause.

    Parameters
    ----------
    weights : array_like of float, shape (L, S), (H, L, S) or (B, H, L, S)
        E.g. ``cyattn.attention_weights(q, k, ...)``. With 4 dims, batch entry
        ``batch_index`` is drawn; 2 dims draw one panel.
    batch_index : int, optional
        Which batch entry of 4-D weights (default 0).
    mask : array_like of bool or float, optional
        Broadcastable to ``weights.shape`` (e.g. a (B, 1, 1, S) key-padding mask); bool True =
        take part, float ``-inf`` removes. The entry ``batch_index`` is used.
    query_labels, key_labels : sequence of str, optional
        L and S labels (the tokens of the drawn batch entry). Shown on the left column and
        the bottom row of panels.
    heads : sequence of int, optional
        Which heads to draw (default all).
    ncols : int, optional
        Panels per row (default ``ceil(sqrt(number of heads))``).
    title : str, optional
        The figure's title.
    masked_color, cmap, is_causal, causal_alignment, window, nan_color
        As in :func:`attention_heatmap`.
    vmax : float, optional
        Top of the shared colour scale (default the largest visible finite weight of the
        drawn heads).
    panel_size : float, optional
        Width and height of a panel in inches (default 2.6).

    Returns
    -------
    matplotlib.figure.Figure
        A new figure (``plt.figure()``, not shown); ``fig.axes`` holds the panels, then the
        colorbar's Axes.

    Raises
    ------
    TypeError
        As :func:`attention_heatmap`; also if ``batch_index``, ``ncols`` or a head is not an
        int.
    ValueError
        If ``weights`` is not 2-D, 3-D or 4-D, ``batch_index`` or a head is out of range,
        ``ncols`` < 1, a label count does not match L or S, ``mask`` does not broadcast to
        ``weights.shape``, or as :func:`attention_heatmap`.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import numpy as np, cyattn, cyattn.plot
    >>> q = np.random.default_rng(0).standard_normal((2, 4, 5, 8))     # (B, H, L, E)
    >>> pad = np.array([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    >>> w = cyattn.attention_weights(q, q, pad)
    >>> fig = cyattn.plot.attention_heads(w, mask=pad, batch_index=1)
    >>> len(fig.axes)                                   # 4 heads and the colorbar
    5
    """
    f = "cyattn.plot.attention_heads"
    w = _weights_array(weights, f, (2, 3, 4))
    L, S = w.shape[-2:]
    keep = _keep(w.shape, mask, is_causal, causal_alignment, window, f)
    if w.ndim == 4:
        b = _index(batch_index, w.shape[0], "batch_index", f)
        w, keep = w[b], keep[b]
    elif w.ndim == 2:
        w, keep = w[None], keep[None]
    H = w.shape[0]
    if heads is None:
        heads = list(range(H))
    else:
        heads = [_index(h, H, "heads", f) for h in heads]
        if not heads:
            raise ValueError(f"{f}: heads is empty; expected at least one head index")
    query_labels = _labels(query_labels, L, "query_labels", "L = weights.shape[-2]", f)
    key_labels = _labels(key_labels, S, "key_labels", "S = weights.shape[-1]", f)
    if ncols is None:
        ncols = math.ceil(math.sqrt(len(heads)))
    elif isinstance(ncols, (bool, np.bool_)) or not isinstance(ncols, numbers.Integral):
        raise TypeError(f"{f}: ncols must be an int or None, got {type(ncols).__name__}")
    elif ncols < 1:
        raise ValueError(f"{f}: ncols must be >= 1, got {ncols}")
    ncols = min(int(ncols), len(heads))
    nrows = math.ceil(len(heads) / ncols)
    norm = _norm(w[heads], keep[heads], vmax)
    fig = plt.figure(figsize=(panel_size * ncols + 1.5, panel_size * nrows + 0.6),
                     layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for n, h in enumerate(heads):
        ax = axes[n // ncols, n % ncols]
        _draw(ax, w[h], keep[h], norm, cmap, masked_color, nan_color, query_labels, key_labels,
              f"head {h}", fontsize=8)
        if n % ncols:
            ax.set_ylabel("")
            if query_labels is not None:
                ax.set_yticklabels([t.get_text() if t.get_color() == _EMPTY_ROW_COLOR
                                    else "" for t in ax.get_yticklabels()])
        if n + ncols < len(heads):                   # a panel below shows the keys
            ax.set_xlabel("")
            if key_labels is not None:
                ax.set_xticklabels([])
    for n in range(len(heads), nrows * ncols):
        axes[n // ncols, n % ncols].remove()
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes.ravel()[:len(heads)].tolist(),
                 label="weight", shrink=0.8)
    if title is not None:
        fig.suptitle(title)
    return fig


def _index(value, n, name, fname):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{fname}: {name} must be an int, got {type(value).__name__}")
    if not -n <= value < n:
        raise ValueError(f"{fname}: {name} {value} is out of range for {n} entries")
    return int(value) % n


def mask_pattern(L, S, *, attn_mask=None, is_causal=False, causal_alignment="top_left",
                 window=None, ax=None, title=None, query_labels=None, key_labels=None,
                 visible_color="tab:blue", masked_color="lightgrey"):
    """Draw which keys each query may see: the geometry of a mask, without any data.

    The tool for checking an alignment or a window before running a model: cell (i, j) is
    ``visible_color`` when key j is visible to query i and ``masked_color`` when it is
    removed; rows with no visible key are marked ``∅`` in red on the y-axis. Visibility is
    that of :func:`cyattn.scaled_dot_product_attention`: the bool mask (True = take part) or
    float mask (``-inf`` removes), the causal rule ``j <= p(i)`` and the window
    ``p(i) - left <= j <= p(i) + right``, composed by AND, with ``p(i) = i`` for
    ``"top_left"`` and ``i + S - L`` for ``"bottom_right"``.

    Parameters
    ----------
    L, S : int
        Number of query rows and keys.
    attn_mask : array_like of bool or float, optional
        Broadcastable to (L, S).
    is_causal : bool, optional
    causal_alignment : {"top_left", "bottom_right"}, optional
    window : (int or None, int or None), optional
        ``(left, right)`` keys visible on either side of ``p(i)``; None = unbounded.
    ax : matplotlib.axes.Axes, optional
        Axes to draw in; default a new figure (not shown).
    title : str, optional
        Default: a summary of the options, e.g. ``"causal bottom_right, L=3, S=6"``.
    query_labels, key_labels : sequence of str, optional
        L and S labels.
    visible_color, masked_color : matplotlib colours, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    TypeError
        If ``L`` or ``S`` is not an int, or as :func:`attention_heatmap` for the mask, labels,
        ``is_causal`` and ``window``.
    ValueError
        If ``L`` or ``S`` is negative, or as :func:`attention_heatmap`.

    Examples
    --------
    >>> import matplotlib; matplotlib.use("Agg")
    >>> import cyattn.plot
    >>> ax = cyattn.plot.mask_pattern(3, 6, is_causal=True, causal_alignment="bottom_right")
    >>> ax.get_title()
    'causal bottom_right, L=3, S=6'
    """
    f = "cyattn.plot.mask_pattern"
    for name, value in (("L", L), ("S", S)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{f}: {name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{f}: {name} must be >= 0, got {value}")
    L, S = int(L), int(S)
    query_labels = _labels(query_labels, L, "query_labels", "L", f)
    key_labels = _labels(key_labels, S, "key_labels", "S", f)
    keep = _keep((L, S), attn_mask, is_causal, causal_alignment, window, f, name="attn_mask",
                 target="(L, S) =")
    if title is None:
        parts = []
        if attn_mask is not None:
            parts.append("mask")
        if is_causal:
            parts.append(f"causal {causal_alignment}")
        if window is not None:
            parts.append(f"window {tuple(window)}"
                         + (f" {causal_alignment}" if not is_causal else ""))
        title = f"{' + '.join(parts) or 'no mask'}, L={L}, S={S}"
    if ax is None:
        ax = plt.figure(figsize=_figsize(L, S), layout="constrained").add_subplot()
    # visible cells: the top of a two-colour map; _draw paints the removed ones
    cmap = matplotlib.colors.ListedColormap([visible_color])
    _draw(ax, np.ones((L, S)), keep, Normalize(0.0, 1.0), cmap, masked_color, "red",
          query_labels, key_labels, title)
    return ax


def mask_kinds_figure():
    """The figure of ``python -m cyattn plot --demo``: the mask kinds of the README's
    semantics table as pictures.

    Six panels (visible keys in blue, removed ones in grey, fully masked rows ``∅``): causal
    ``top_left`` and ``bottom_right`` with L = 4 < S = 7; key padding (a bool mask, True =
    take part); a causal sliding window (2, 0); ``bottom_right`` with L = 6 > S = 4, whose
    first rows see no key (fully masked: weights and output 0); and the weights of a padded
    row from :func:`cyattn.attention_weights`, where a removed key (grey) differs from a
    permitted one whose weight is ~0 (dark).

    Returns
    -------
    matplotlib.figure.Figure
        A figure made without pyplot (no window, any backend): save it with
        ``fig.savefig(path)``.
    """
    from matplotlib.figure import Figure

    from .weights import attention_weights

    fig = Figure(figsize=(10.5, 6.6), layout="constrained")
    axes = fig.subplots(2, 3)
    mask_pattern(4, 7, is_causal=True, ax=axes[0, 0],
                 title="causal, top_left (PyTorch, JAX)\nquery i sees keys j <= i")
    mask_pattern(4, 7, is_causal=True, causal_alignment="bottom_right", ax=axes[0, 1],
                 title="causal, bottom_right (KV cache)\nj <= i + S - L")
    pad = np.array([True] * 4 + [False] * 2)
    mask_pattern(6, 6, attn_mask=pad, ax=axes[0, 2],
                 title="key padding: bool mask\nTrue = take part")
    mask_pattern(7, 7, is_causal=True, window=(2, 0), ax=axes[1, 0],
                 title="causal sliding window (2, 0)\ni - 2 <= j <= i")
    mask_pattern(6, 4, is_causal=True, causal_alignment="bottom_right", ax=axes[1, 1],
                 title="bottom_right, L > S: rows 0-1\nfully masked (weights 0)")
    # weights: query 0 attends sharply to key 0, so keys 1-3 get ~0 but are permitted
    q = np.array([[8.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    k = np.array([[8.0, 0.0], [0.0, 1.0], [0.0, -1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    pad = np.array([True] * 4 + [False] * 2)
    attention_heatmap(attention_weights(q, k, pad, scale=1.0), mask=pad, ax=axes[1, 2],
                      title="weights: padding grey,\n~0 weights dark (permitted)")
    fig.suptitle("cyattn mask kinds (blue: key visible to the query, grey: removed)")
    return fig
