"""The bench plot (sdpa_gflops.png): SDPA GFLOP/s against sequence length per implementation and
thread count, one panel per mask kind, with the FMA peak x threads and the best sgemm rate as
horizontal lines. Needs matplotlib (skipped without it)."""
from .cases import HEAD_DIM, SDPA_KINDS
from .report import _best_sgemm, _Row

PLOT_NAME = "sdpa_gflops.png"


def write_plot(result, path):
    """PNG: SDPA GFLOP/s vs sequence length per implementation and thread count (one panel per
    dense / causal / padding). Returns the path, or None when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    meta = result["meta"]
    rows = [_Row(r, meta) for r in result["rows"]]
    sdpa = [r for r in rows if r.spec.group == "sdpa"]
    kinds = [k for k in SDPA_KINDS if any(r.spec.kind == k for r in sdpa)]
    if not kinds:
        return None
    fig, axes = plt.subplots(1, len(kinds), figsize=(5.2 * len(kinds), 4.4), sharey=True,
                             squeeze=False)
    colors = {"cyattn": "C0", "numpy": "C1", "torch": "C2", "ort": "C3", "jax": "C4"}
    styles = ["-", "--", ":", "-."]
    per_len = {}
    for r in sdpa:                       # per T, plot the case with the most heads x batch
        bh = r.spec.shape[0] * r.spec.shape[1]
        per_len[r.spec.seq_len] = max(per_len.get(r.spec.seq_len, 0), bh)
    peak = meta.get("fma_peak_gflops")
    for ax, kind in zip(axes[0], kinds):
        for impl in meta["impls"]:
            for ti, n in enumerate(meta["threads"]):
                pts = sorted((r.spec.seq_len, r.gflops(impl)) for r in sdpa
                             if r.spec.kind == kind and r.threads == n and r.has(impl)
                             and r.spec.shape[0] * r.spec.shape[1] == per_len[r.spec.seq_len])
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts],
                            marker="os^D"[ti % 4], markersize=5,
                            markerfacecolor=colors.get(impl) if ti == 0 else "none",
                            color=colors.get(impl), linestyle=styles[ti % len(styles)],
                            label=f"{impl}, {n} thread{'s' if n != 1 else ''}")
        if peak:
            for ti, n in enumerate(meta["threads"]):
                ax.axhline(peak * n, color="0.6", linewidth=0.8,
                           linestyle=styles[ti % len(styles)],
                           label=f"FMA peak × {n}" if ax is axes[0][0] else None)
        for ti, n in enumerate(meta["threads"]):
            best = _best_sgemm(meta, n)
            if best:
                ax.axhline(best, color="0.25", linewidth=0.8, linestyle=styles[ti % len(styles)],
                           label=f"best sgemm, {n} thread{'s' if n != 1 else ''}"
                           if ax is axes[0][0] else None)
        ax.set_xscale("log", base=2)
        ticks = sorted(per_len)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        title = {"dense": "dense", "causal": "causal (half the FLOPs counted)",
                 "padding": "padding mask (FLOPs counted dense)"}[kind]
        ax.set_title(f"SDPA {title}, E = {HEAD_DIM}", fontsize=10)
        ax.set_xlabel("sequence length T (L = S)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("GFLOP/s")
    axes[0][0].legend(fontsize=7, loc="best")
    bh = ", ".join(f"T={t}: {per_len[t]}" for t in sorted(per_len))
    names = " vs ".join(meta["impls"][1:]) + (" (ort = ONNX Runtime)" if "ort" in meta["impls"]
                                              else "")
    fig.suptitle(f"cyattn {meta['variant']} vs {names}, float32, {meta['cpu']}, "
                 f"{meta['date']}\nB·H per point: {bh}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
