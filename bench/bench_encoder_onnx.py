"""cyattn.encoder's families (issue 48) against ONNX Runtime on each model's ONNX export and
against sentence-transformers (PyTorch, CPU), interleaved in one process.

For each family (BERT, XLM-RoBERTa, ModernBERT, Qwen3) a seeded random model is saved with the
tiny tokenizer of ``tests/tiny_models.py`` (``bench_encoder_families.build``) and sizes:

- ``--size minilm`` (default): the sizes of ``bench_encoder_families.py`` (6 layers, hidden
  384, 12 heads of 32, FFN 1536; ModernBERT window 128, FFN 1152; Qwen3 8/2 heads of 64, FFN
  1024), which is multilingual-e5-small's width at half its depth;
- ``--size real``: the widths of the models services run, at fewer layers so a round takes
  seconds: BERT/XLM-RoBERTa as multilingual-e5-small (hidden 384, 12 heads, FFN 1536, 4 layers
  of its 12), ModernBERT as gte-modernbert-base (hidden 768, 12 heads, GeGLU FFN 1152, window
  128, 3 layers of its 22: global, local, local), Qwen3 as Qwen3-Embedding-0.6B (hidden 1024,
  16/8 heads of 128, FFN 3072, 2 layers of its 28).

The transformers model plus the pooling (mean, or Qwen3's last token) and the L2 norm is
exported with ``torch.onnx.export`` (the dynamo exporter where onnxscript is installed, else
the TorchScript one, opset 17; dynamic batch and sequence axes) and run by an
``onnxruntime.InferenceSession`` with all graph optimisations and ``intra_op_num_threads`` =
the thread count (``inter_op`` 1). BERT and XLM-RoBERTa also run as ORT's transformer optimiser
(``onnxruntime.transformers.optimizer``, model_type "bert": fused attention, LayerNorm, GELU)
leaves them ("ORT fused"); the ratio is against the faster ORT. ORT and
sentence-transformers get the texts as sentence-transformers batches them: sorted by length,
``batch_size`` at a time, padded to the batch's longest (right padding; a causal model's last
real token sees no padding). Outputs are checked first (min cosine of every engine against
sentence-transformers over all texts); then rounds alternate the three engines, and the median
of the rounds is reported per thread count (texts per second, ratios).

    python bench/bench_encoder_onnx.py [--size minilm|real] [--rounds 5] [--texts 256]
        [--threads 1 2] [--families bert xlm-roberta modernbert qwen3] [--md FILE]

Needs: cyattn, safetensors, tokenizers, torch, transformers, sentence-transformers, onnx,
onnxruntime (optional elsewhere: nothing in the package imports it).
"""
import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_encoder_families as fam  # noqa: E402

import cyattn  # noqa: E402
import cyattn.encoder  # noqa: E402

REAL = {
    "bert": dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=12,
                 intermediate_size=1536, max_position_embeddings=512),
    "xlm-roberta": dict(hidden_size=384, num_hidden_layers=4, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=514),
    "modernbert": dict(hidden_size=768, num_hidden_layers=3, num_attention_heads=12,
                       intermediate_size=1152, local_attention=128, max_position_embeddings=512),
    "qwen3": dict(hidden_size=1024, num_hidden_layers=2, num_attention_heads=16,
                  num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                  max_position_embeddings=512),
}


def build(family, root, size):
    import tiny_models
    if size == "minilm":
        return fam.build(family, root)
    tiny_models.save_model(root / "hf", family, seed=0, **REAL[family])
    st = tiny_models.sentence_transformer(
        root / "hf", root / "st", pooling="lasttoken" if family == "qwen3" else "mean",
        max_seq_length=256)
    return st, cyattn.encoder.load(root / "st")


def fuse(path, out, heads, hidden):
    """ONNX Runtime's own transformer optimiser on a BERT-type export (fused attention,
    LayerNorm, GELU, bias adds), as a tuned ORT deployment would ship it; None if it fails."""
    try:
        from onnxruntime.transformers.optimizer import optimize_model
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = optimize_model(str(path), model_type="bert", num_heads=heads,
                               hidden_size=hidden, opt_level=1)
        m.save_model_to_file(str(out))
        return out
    except Exception as exc:               # noqa: BLE001 -- report and go on without it
        print(f"ORT transformer optimiser failed: {type(exc).__name__}: {exc}")
        return None


def export(st, family, path):
    """Export ``st``'s transformer + pooling + normalisation to ONNX at ``path``; returns the
    exporter that worked."""
    import torch
    hf = st[0].auto_model.eval()
    last = family == "qwen3"

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, input_ids, attention_mask):
            h = self.hf(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if last:
                idx = attention_mask.sum(1) - 1
                pooled = h[torch.arange(h.shape[0]), idx]
            else:
                m = attention_mask.unsqueeze(-1).to(h.dtype)
                pooled = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    model = Pooled().eval()
    ids = torch.randint(5, 20, (3, 17))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    errors = []
    for dynamo in (True, False):
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                if dynamo:
                    b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
                    torch.onnx.export(model, (ids, mask), str(path), dynamo=True,
                                      input_names=["input_ids", "attention_mask"],
                                      output_names=["embedding"],
                                      dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}),
                                      optimize=True, verbose=False)
                else:
                    torch.onnx.export(model, (ids, mask), str(path), dynamo=False,
                                      input_names=["input_ids", "attention_mask"],
                                      output_names=["embedding"], opset_version=17,
                                      dynamic_axes={"input_ids": {0: "b", 1: "s"},
                                                    "attention_mask": {0: "b", 1: "s"}})
            return "dynamo" if dynamo else "torchscript"
        except Exception as exc:           # noqa: BLE001 -- try the other exporter
            errors.append(f"{'dynamo' if dynamo else 'torchscript'}: "
                          f"{type(exc).__name__}: {str(exc)[:300]}")
    raise RuntimeError("ONNX export failed:\n" + "\n".join(errors))


class OrtEngine:
    """ONNX Runtime sessions (one per thread count) batching as sentence-transformers does."""

    def __init__(self, path, tokenizer, threads):
        import onnxruntime as ort
        self.sessions = {}
        for n in threads:
            opt = ort.SessionOptions()
            opt.intra_op_num_threads = n
            opt.inter_op_num_threads = 1
            opt.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            self.sessions[n] = ort.InferenceSession(str(path), opt,
                                                    providers=["CPUExecutionProvider"])
        self.tokenizer = tokenizer

    def encode(self, texts, batch_size, n_threads):
        sess = self.sessions[n_threads]
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = None
        for s in range(0, len(order), batch_size):
            idx = order[s:s + batch_size]
            L = max(len(ids[i]) for i in idx)
            x = np.zeros((len(idx), L), np.int64)
            m = np.zeros((len(idx), L), np.int64)
            for r, i in enumerate(idx):
                x[r, :len(ids[i])] = ids[i]
                m[r, :len(ids[i])] = 1
            y = sess.run(None, {"input_ids": x, "attention_mask": m})[0]
            if out is None:
                out = np.empty((len(ids), y.shape[1]), np.float32)
            out[idx] = y
        return out


def min_cos(a, b):
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=["minilm", "real"], default="minilm")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--texts", type=int, default=256)
    ap.add_argument("--max-words", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--families", nargs="+",
                    default=["bert", "xlm-roberta", "modernbert", "qwen3"])
    ap.add_argument("--md", help="append a markdown table to this file")
    args = ap.parse_args(argv)
    import onnxruntime
    import torch
    data = fam.texts(args.texts, args.max_words)
    rows = []
    load = [os.getloadavg()[0]]
    print(f"cyattn {cyattn.__version__} ({cyattn.config().get('variant', '?')}), torch "
          f"{torch.__version__}, onnxruntime {onnxruntime.__version__}, {platform.processor()}")
    print(f"{'family':12} {'thr':>3} {'cyattn/s':>9} {'st/s':>8} {'ort/s':>8} {'fused/s':>8} "
          f"{'vs st':>6} "
          f"{'vs ort':>6}  exporter   cos(cy,st) cos(ort,st) load")
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families:
            root = Path(tmp) / family
            st, enc = build(family, root, args.size)
            exporter = export(st, family, root / "model.onnx")
            ort_engine = OrtEngine(root / "model.onnx", enc.tokenizer, args.threads)
            fused = None
            if family in ("bert", "xlm-roberta"):
                path = fuse(root / "model.onnx", root / "fused.onnx", enc.heads, enc.hidden)
                if path is not None:
                    fused = OrtEngine(path, enc.tokenizer, args.threads)
            torch.set_num_threads(max(args.threads))
            want = st.encode(data, batch_size=args.batch_size)
            cos_cy = min_cos(enc.encode(data, args.batch_size), want)
            cos_ort = min_cos(ort_engine.encode(data, args.batch_size, args.threads[0]), want)
            if fused is not None:
                cos_ort = min(cos_ort, min_cos(fused.encode(data, args.batch_size,
                                                            args.threads[0]), want))
            for n in args.threads:
                torch.set_num_threads(n)
                times = {"cyattn": [], "st": [], "ort": [], "ort_fused": []}
                engines = {
                    "cyattn": lambda n=n, e=enc: e.encode(data, args.batch_size, n_threads=n),
                    "st": lambda m=st: m.encode(data, batch_size=args.batch_size),
                    "ort": lambda n=n, o=ort_engine: o.encode(data, args.batch_size, n),
                }
                if fused is not None:
                    engines["ort_fused"] = lambda n=n, f=fused: f.encode(data, args.batch_size,
                                                                         n)
                for run in engines.values():           # warm-up
                    run()
                for r in range(args.rounds):
                    names = list(engines)
                    names = names[r % len(names):] + names[:r % len(names)]   # rotate
                    for name in names:
                        t0 = time.perf_counter()
                        engines[name]()
                        times[name].append(time.perf_counter() - t0)
                    load.append(os.getloadavg()[0])
                c, s, o = (len(data) / statistics.median(times[k])
                           for k in ("cyattn", "st", "ort"))
                of = len(data) / statistics.median(times["ort_fused"]) if fused else None
                la = os.getloadavg()[0]
                rows.append((family, n, c, s, o, of, exporter, cos_cy, cos_ort, la))
                best = max(o, of or 0.0)
                print(f"{family:12} {n:>3} {c:>9.1f} {s:>8.1f} {o:>8.1f} "
                      f"{'-' if of is None else f'{of:.1f}':>8} {c / s:>5.2f}x "
                      f"{c / best:>5.2f}x  {exporter:10} {cos_cy:.7f}  {cos_ort:.7f}  {la:.1f}",
                      flush=True)
    print(f"load average (1 min) over the run: {min(load):.1f}-{max(load):.1f}")
    if args.md:
        with open(args.md, "a") as f:
            f.write(f"\n`--size {args.size}`, {args.texts} texts of 5-{args.max_words} words, "
                    f"batch {args.batch_size}, medians of {args.rounds} rounds; load average "
                    f"(1 min) {min(load):.1f}-{max(load):.1f} during the run\n\n")
            f.write("| family | threads | cyattn texts/s | sentence-transformers | "
                    "ONNX Runtime | ORT fused | vs ST | vs best ORT | exporter | "
                    "min cosine cyattn/ST | ORT/ST |\n"
                    "|---|---|---|---|---|---|---|---|---|---|---|\n")
            for family, n, c, s, o, of, exporter, cc, co, _ in rows:
                f.write(f"| {family} | {n} | {c:.1f} | {s:.1f} | {o:.1f} | "
                        f"{'-' if of is None else f'{of:.1f}'} | {c / s:.2f}x | "
                        f"{c / max(o, of or 0.0):.2f}x | {exporter} | {cc:.7f} | {co:.7f} |\n")


if __name__ == "__main__":
    main()
