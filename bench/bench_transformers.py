"""A Llama-shaped transformers model with attn_implementation="sdpa" vs "cyattn".

Random weights (no hub): hidden 512, 8 query heads and 2 key/value heads of 64 (GQA), 2
layers, vocab 1000, by default. One model per dtype; its attention implementation is
switched between samples with ``set_attn_implementation`` (same weights), so the two run
interleaved in one process (A B A B ...). For each thread count and dtype:

* prefill: one forward over a random prompt of each length (``logits_to_keep=1``, as generate
  does), no cache;
* decode: a prompt of ``--context`` tokens is prefilled once per implementation into a
  DynamicCache, then ``--decode-tokens`` single-token steps are timed (each step's cache is
  cropped back, so every step sees the same context).

Both report the median end-to-end seconds and the median time spent inside the attention
function (each registered attention function is wrapped with a timer), and the ratios
sdpa / cyattn (above 1: cyattn is faster). ``--rss`` measures the peak RSS of one float32
prefill of that length in fresh processes (``--rss-runs`` per implementation, interleaved;
median and range), without and with a padding mask.

    python bench/bench_transformers.py [--threads 1 2] [--dtypes float32 bfloat16]
        [--prefill 512 2048 8192] [--context 4096] [--decode-tokens 16] [--samples 3]
        [--rss 8192]

Needs: cyattn, torch, transformers.
"""
import argparse
import copy
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import transformers
from transformers import AttentionInterface

import cyattn.transformers

IMPLS = ("sdpa", "cyattn")
_attention_seconds = {name: 0.0 for name in IMPLS}


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _attention_seconds[name] += time.perf_counter() - t
    return wrapper


def install_timers():
    cyattn.transformers.register()
    for name in IMPLS:
        AttentionInterface._global_mapping[name] = _timed(name,
                                                          AttentionInterface._global_mapping[name])


def build(args, dtype):
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.kv_heads, max_position_embeddings=16384)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(copy.deepcopy(config),
                                                      attn_implementation="sdpa",
                                                      dtype=dtype).eval()


def _measure(model, impl, fn):
    model.set_attn_implementation(impl)
    _attention_seconds[impl] = 0.0
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, _attention_seconds[impl]


def prefill_case(model, length, samples):
    ids = torch.randint(0, model.config.vocab_size, (1, length),
                        generator=torch.Generator().manual_seed(length))

    def run():
        model(ids, use_cache=False, logits_to_keep=1)

    for impl in IMPLS:                                   # warm-up
        _measure(model, impl, run)
    res = {impl: [] for impl in IMPLS}
    for _ in range(samples):
        for impl in IMPLS:
            res[impl].append(_measure(model, impl, run))
    return res


def decode_case(model, context, tokens, samples):
    ids = torch.randint(0, model.config.vocab_size, (1, context),
                        generator=torch.Generator().manual_seed(context))
    caches = {}
    for impl in IMPLS:
        model.set_attn_implementation(impl)
        out = model(ids, use_cache=True, logits_to_keep=1)
        caches[impl] = (getattr(out, "cache", None) or out.past_key_values,
                       out.logits[:, -1:].argmax(-1))

    def steps(impl):
        cache, token = caches[impl]

        def run():
            for _ in range(tokens):
                model(token, cache=cache, use_cache=True, logits_to_keep=1)
                cache.crop(-1)                 # back to the context
        return run

    for impl in IMPLS:
        _measure(model, impl, steps(impl))
    res = {impl: [] for impl in IMPLS}
    for _ in range(samples):
        for impl in IMPLS:
            total, attn = _measure(model, impl, steps(impl))
            res[impl].append((total / tokens, attn / tokens))
    return res


def _row(label, res):
    med = {impl: (statistics.median(t for t, _ in res[impl]),
                  statistics.median(a for _, a in res[impl])) for impl in IMPLS}
    (st, sa), (ct, ca) = med["sdpa"], med["cyattn"]
    return (f"| {label} | {_ms(sa)} | {_ms(ca)} | {sa / ca:.2f}x | {_ms(st)} | {_ms(ct)} | "
            f"{st / ct:.2f}x |")


def _ms(seconds):
    """Milliseconds with three significant digits at least (a decode step takes ~0.5 ms)."""
    ms = seconds * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.3g}"


def _peak_rss_kib(reset=False):
    """Peak RSS of this process in KiB; on Linux ``reset`` restarts the peak from the current
    RSS (``/proc/self/clear_refs``), so that the peak of one call can be read."""
    try:
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _rss_child(args, impl, length, padded):
    torch.set_num_threads(args.threads[0])
    install_timers()
    model = build(args, torch.float32)
    model.set_attn_implementation(impl)
    ids = torch.randint(0, args.vocab, (1, length))
    mask = torch.ones_like(ids)
    if padded:
        mask[0, 0] = 0                     # one left pad token: transformers builds a mask
    before = _peak_rss_kib(reset=True)
    with torch.inference_mode():
        model(ids, attention_mask=mask, use_cache=False, logits_to_keep=1)
    print(f"{before} {_peak_rss_kib()}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    p.add_argument("--prefill", type=int, nargs="*", default=[512, 2048, 8192])
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--samples", type=int, default=3)
    p.add_argument("--rss", type=int, nargs="*", default=[8192])
    p.add_argument("--rss-runs", type=int, default=5,
                   help="fresh processes per implementation and case (the peak varies by "
                        "tens of MiB from process to process: allocator and page layout)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--rss-child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.rss_child:
        impl, length, padded = args.rss_child
        return _rss_child(args, impl, int(length), padded == "padded")

    install_timers()
    print(f"Llama-shaped: hidden {args.hidden}, {args.hidden // 64} query heads, "
          f"{args.kv_heads} kv heads, head dim 64, {args.layers} layers, vocab {args.vocab}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"cyattn {cyattn.__version__} ({cyattn.config()['variant']}); medians of "
          f"{args.samples} interleaved samples")
    print("\n| case | attention sdpa ms | attention cyattn ms | ratio | end to end sdpa ms | "
          "end to end cyattn ms | ratio |\n|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for n in args.threads:
            torch.set_num_threads(n)
            for dtype_name in args.dtypes:
                model = build(args, getattr(torch, dtype_name))
                for length in args.prefill:
                    res = prefill_case(model, length, args.samples)
                    print(_row(f"{n} thr {dtype_name} prefill {length}", res), flush=True)
                if args.decode_tokens:
                    res = decode_case(model, args.context, args.decode_tokens, args.samples)
                    print(_row(f"{n} thr {dtype_name} decode at {args.context} (per token)",
                               res), flush=True)
                del model
    for length in args.rss:
        for padded in ("unpadded", "padded"):
            print(f"\nPeak RSS during one float32 prefill of {length} tokens, {padded} "
                  f"(fresh process, {args.threads[0]} thread; 'padded': one pad token, so "
                  f"transformers passes an L x S mask):")
            peaks = {impl: [] for impl in IMPLS}
            for _ in range(args.rss_runs):              # interleaved: A B A B ...
                for impl in IMPLS:
                    out = subprocess.run(
                        [sys.executable, __file__, "--rss-child", impl, str(length), padded,
                         "--threads", str(args.threads[0]), "--hidden", str(args.hidden),
                         "--kv-heads", str(args.kv_heads), "--layers", str(args.layers),
                         "--vocab", str(args.vocab)], capture_output=True, text=True,
                        check=True)
                    before, after = map(int, out.stdout.split()[-2:])
                    peaks[impl].append((after / 1024, (after - before) / 1024))
            for impl in IMPLS:
                top = [p for p, _ in peaks[impl]]
                above = [a for _, a in peaks[impl]]
                print(f"  {impl:7s} peak {statistics.median(top):.0f} MiB ({min(top):.0f}-"
                      f"{max(top):.0f}), {statistics.median(above):.0f} MiB above the RSS "
                      f"before the prefill; median of {args.rss_runs} processes")


if __name__ == "__main__":
    main()
