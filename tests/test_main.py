"""``python -m cyattn``: info, check, the default command (with a tiny bench) and main().

The command line runs in a subprocess (``sys.executable``) from a temporary working directory,
so it uses the same cyattn this test session imported. No timing assertions.
"""
import io
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import child_env, timeout_scale

import cyattn
from cyattn import __main__ as cli
from cyattn import _bench, _selfcheck


def run_cli(tmp_path, *args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "cyattn", *args], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=timeout * timeout_scale())
    return proc


def test_info(tmp_path):
    proc = run_cli(tmp_path, "info")
    assert proc.returncode == 0, proc.stderr
    cfg = cyattn.config()
    out = proc.stdout
    assert f"cyattn {cyattn.__version__}" in out
    assert re.search(rf"^variant:\s+{cfg['variant']}\b", out, re.M)
    assert re.search(r"^available_variants:\s+\S", out, re.M)
    assert re.search(r"^cpu_features:", out, re.M)
    assert re.search(r"^openmp:\s+(on|off)", out, re.M)
    assert re.search(r"^default_threads:\s+\d+", out, re.M)


def test_check_50(tmp_path):
    proc = run_cli(tmp_path, "check", "--cases", "50")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: 50/50 cases match the oracle" in proc.stdout
    assert "MISMATCH" not in proc.stdout


def test_default_command_quick(tmp_path):
    proc = run_cli(tmp_path, "--quick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert re.search(rf"^variant:\s+{cyattn.config()['variant']}\b", out, re.M)
    assert "softmax weights [0.665, 0.245, 0.090]" in out
    assert "attention output [0.935, 0.579]" in out
    assert "check: 300/300 cases match the oracle" in out
    # the bench table: a header and one row per quick case, with a speedup column
    assert re.search(r"^case\s+cyattn\s+numpy\s+speedup", out, re.M)
    assert re.search(r"^softmax \(8,16,128\)\s.*\d\.\d\dx", out, re.M)
    assert re.search(r"^matmul_accumulate n=64\s", out, re.M)
    assert re.search(r"^sdpa \(1,2,64,32\)\s", out, re.M)
    assert "warning" not in out


@pytest.mark.skipif("avx2" not in cyattn._backend.cpu_features(),
                    reason="sets OPENBLAS_CORETYPE=Haswell, which runs AVX2 code in NumPy")
def test_bench_reexecs_without_openblas_overrides(tmp_path):
    env = child_env()
    env["OPENBLAS_CORETYPE"] = "Haswell"
    proc = subprocess.run([sys.executable, "-m", "cyattn", "bench", "--quick"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OPENBLAS_CORETYPE=Haswell is set" in proc.stdout
    assert "re-running the benchmark in a child process" in proc.stdout
    assert re.search(r"^sdpa \(1,2,64,32\)\s", proc.stdout, re.M)


def test_bad_arguments(tmp_path):
    proc = run_cli(tmp_path, "check", "--cases", "0")
    assert proc.returncode == 2
    assert "expected a positive integer" in proc.stderr
    proc = run_cli(tmp_path, "nonsense")
    assert proc.returncode == 2


# ------------------------------------------------------------------------------------------
# In-process: the check must catch a wrong kernel, and its pieces behave.
# ------------------------------------------------------------------------------------------


def test_check_reports_mismatch(monkeypatch, capsys):
    real = cyattn.softmax

    def wrong_softmax(x, axis=-1, *, mask=None, out=None):
        res = real(x, axis, mask=mask, out=out)
        return res * np.asarray(1.001, dtype=res.dtype) if res.size else res

    monkeypatch.setattr(cyattn, "softmax", wrong_softmax)
    assert cli.main(["check", "--cases", "20", "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH #0 softmax(" in out
    assert "dtype=float32" in out and "shape=" in out
    assert re.search(r"check: (\d+)/20 cases match the oracle", out)
    assert "check: 20/20" not in out


def test_check_reports_exception(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(cyattn, "matmul_accumulate", broken)
    assert cli.main(["check", "--cases", "10"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH #2 matmul_accumulate(" in out
    assert "raised RuntimeError: boom" in out


def test_default_command_fails_on_wrong_example(monkeypatch, capsys):
    monkeypatch.setattr(cyattn, "softmax", lambda x, *a, **k: np.full(np.shape(x), 1 / 3))
    assert cli.cmd_example() == 1
    assert "example: FAILED: softmax weights" in capsys.readouterr().out


def test_cases_are_reproducible_and_cover_the_edges():
    a = _selfcheck.generate_cases(300, seed=5)
    b = _selfcheck.generate_cases(300, seed=5)
    assert [c.describe() for c in a] == [c.describe() for c in b]
    funcs = {c.func for c in a}
    assert funcs == {"softmax", "log_softmax", "matmul_accumulate",
                     "scaled_dot_product_attention"}
    assert {c.dtype for c in a} == {np.dtype(np.float32), np.dtype(np.float64)}
    sdpa = [c.params for c in a if c.func == "scaled_dot_product_attention"]
    assert {p["mask"] for p in sdpa} >= {"none", "bool", "float", "bool padding"}
    assert {(p["is_causal"], p["causal_alignment"]) for p in sdpa} >= {
        (True, "top_left"), (True, "bottom_right")}
    assert any(0 in p["query"][-2:] or 0 in p["key"][-2:] for p in sdpa)
    soft = [c.params for c in a if c.func in ("softmax", "log_softmax")]
    assert {p["mask"] for p in soft} >= {"none", "bool", "float"}
    assert any(0 in p["shape"] for p in soft) and any(1 in p["shape"] for p in soft)


def test_compare_tolerances():
    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    assert _selfcheck.compare(np.float32([1.0, 0.5]), [1.0 + 1e-6, 0.5], f32) is None
    assert _selfcheck.compare(np.float32([1.0, 0.5]), [1.001, 0.5], f32) is not None
    assert _selfcheck.compare(np.float64([1.0]), [1.0 + 1e-12], f64) is None
    assert _selfcheck.compare(np.float64([1.0]), [1.0 + 1e-8], f64) is not None
    assert _selfcheck.compare(np.float64([np.nan, -np.inf]), [np.nan, -np.inf], f64) is None
    assert "NaN" in _selfcheck.compare(np.float64([0.0]), [np.nan], f64)
    assert "infinity" in _selfcheck.compare(np.float64([np.inf]), [-np.inf], f64)
    assert "shape" in _selfcheck.compare(np.zeros((2, 1)), [[0.0, 0.0]], f64)


def test_bench_helpers():
    calls = []
    times = _bench.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                               samples=5, target=0.0005)
    assert len(times["a"]) == len(times["b"]) == 5
    assert all(t > 0 for t in times["a"] + times["b"])
    # with a pause, each sample is preceded by untimed calls for `warm` seconds, at least one
    # (calibrate makes two calls, and a call longer than target gives one timed call per sample)
    calls.clear()
    times = _bench.interleaved({"a": lambda: calls.append(time.sleep(0.002))},
                               samples=3, target=0.001, pause=0.001, warm=0)
    assert len(times["a"]) == 3 and len(calls) == 2 + 3 * 2
    calls.clear()
    _bench.interleaved({"a": lambda: calls.append(time.sleep(0.002))},
                       samples=3, target=0.001, pause=0.001, warm=0.02)
    assert len(calls) > 2 + 3 * 2
    calls.clear()   # without a pause, one untimed call before each sample
    _bench.interleaved({"a": lambda: calls.append(time.sleep(0.002))}, samples=3, target=0.001)
    assert len(calls) == 2 + 3 * 2
    assert _bench.paired_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0]) == 3.0
    assert _bench.summary([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    np.testing.assert_allclose(_bench.np_softmax(x), cyattn.softmax(x), rtol=1e-5)
    assert _bench.blas_env_overrides({"OPENBLAS_L2_SIZE": "1", "PATH": "x"}) == {
        "OPENBLAS_L2_SIZE": "1"}
    env = _bench.child_env(remove=("OPENBLAS_CORETYPE",), extra={"X_TEST": "1"})
    assert "OPENBLAS_CORETYPE" not in env and env["X_TEST"] == "1"


def test_bench_rerun_with_a_forced_blas_coretype(monkeypatch):
    """--blas-coretype NAME (the AVX2 proxy on an AVX-512 host): the child gets
    OPENBLAS_CORETYPE=NAME and nothing else of the overrides; no re-run when the environment
    already is exactly that, or without overrides and without NAME."""
    from cyattn._bench import timing
    seen = []
    monkeypatch.setattr(timing.subprocess, "call", lambda cmd, env: seen.append(env) or 7)
    monkeypatch.delenv(timing._CHILD_MARK, raising=False)
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), coretype="Haswell") == 7
    assert seen[-1]["OPENBLAS_CORETYPE"] == "Haswell" and "OPENBLAS_L2_SIZE" not in seen[-1]
    monkeypatch.delenv("OPENBLAS_L2_SIZE")
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), coretype="Zen") == 7
    assert seen[-1]["OPENBLAS_CORETYPE"] == "Zen"
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO()) is None
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), coretype="Haswell") is None
    assert len(seen) == 2


def test_bench_rerun_pins_blas_threads_without_threadpoolctl(monkeypatch):
    """The quick bench without threadpoolctl: NumPy's BLAS (and the OpenMP runtime) would run
    on every core beside cyattn's one thread (matmul n=256 read 0.56x NumPy on 2 cores), so it
    re-runs itself with the thread variables set to its thread count; no re-run when they
    already are, when threadpoolctl can pin the pools, or without a thread count."""
    from cyattn._bench import timing
    seen = []
    monkeypatch.setattr(timing.subprocess, "call", lambda cmd, env: seen.append(env) or 5)
    monkeypatch.delenv(timing._CHILD_MARK, raising=False)
    for name in timing.BLAS_ENV_VARS + timing.THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(timing, "have_threadpoolctl", lambda: False)
    msg = io.StringIO()
    assert timing.rerun_without_blas_overrides(["x"], out=msg, threads=1) == 5
    assert all(seen[-1][k] == "1" for k in timing.THREAD_ENV_VARS)
    assert seen[-1][timing._CHILD_MARK] == "1" and "threadpoolctl" in msg.getvalue()
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO()) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")      # some set, to another count: re-run
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), threads=2) == 5
    assert all(seen[-1][k] == "2" for k in timing.THREAD_ENV_VARS)
    for name in timing.THREAD_ENV_VARS:
        monkeypatch.setenv(name, "2")
    assert timing.env_thread_pins(2) == list(timing.THREAD_ENV_VARS)
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), threads=2) is None
    monkeypatch.setattr(timing, "have_threadpoolctl", lambda: True)
    assert timing.rerun_without_blas_overrides(["x"], out=io.StringIO(), threads=3) is None
    assert len(seen) == 2


# ------------------------------------------------------------------------------------------
# The full harness (bench --full, bench/run.py): units, report, command line. No timings.
# ------------------------------------------------------------------------------------------

_TINY_FULL = ["bench", "--full", "--cases", "tiny", "--samples", "1", "--min-time", "0",
              "--threads", "1"]


def test_full_bench_flop_formula_and_units():
    assert _bench.sdpa_flops(1, 8, 512, 512, 64) == 4 * 8 * 512 * 512 * 64
    assert _bench.sdpa_flops(1, 8, 512, 512, 64, causal=True) == 2 * 8 * 512 * 512 * 64
    s = _bench.Spec("sdpa", (8, 8, 128, 128, 64), "causal")
    assert s.name == "sdpa (8,8,128,64) causal"
    assert s.flops == 4 * 64 * 128 * 128 * 64 / 2 and s.seq_len == 128
    pad = _bench.Spec("sdpa", (1, 8, 512, 512, 64), "padding")
    assert pad.name == "sdpa (1,8,512,64) padding mask" and pad.flops == 4 * 8 * 512 * 512 * 64
    dec = _bench.Spec("decode", (1, 32, 1, 4096, 128), "dense")
    assert dec.flops == 4 * 32 * 4096 * 128
    assert dec.kv_bytes == 2 * 32 * 4096 * 128 * 4 == 128 * 2 ** 20
    assert dec.out_bytes == 32 * 128 * 4
    assert _bench.Spec("sdpa", (1, 1, 8192, 8192, 64), "dense").out_bytes == 2 * 2 ** 20
    assert _bench.Spec("matmul", (256,)).flops == 2 * 256 ** 3
    sm = _bench.Spec("softmax", (8, 128, 512), "mask")
    assert sm.name == "softmax (8,128,512) bool mask"
    assert sm.flops is None and sm.elements == 8 * 128 * 512
    assert _bench.Spec.from_json(sm.to_json()).name == sm.name
    assert _bench.fmt_time(4.561e-3, 4.4e-3, 4.9e-3) == "4.56 ms (4.40–4.90)"
    assert _bench.fmt_time(21.8e-6) == "21.8 µs"
    assert _bench.fmt_size(2.0) == "2.00 MiB" and _bench.fmt_size(256 / 2 ** 20) == "256 B"
    assert _bench.parse_thread_list("1,2") == [1, 2]
    with pytest.raises(ValueError):
        _bench.parse_thread_list("0")
    keep = _bench.padding_keep(2, 64)
    assert keep.shape == (2, 1, 1, 64) and keep[0].sum() == 48 and keep[1].sum() == 56


def test_full_bench_case_list():
    names = [s.name for s in _bench.build_specs()]
    halves = len(_bench.cases.half_formats())       # issue 19: 2 SDPA + 1 decode case each
    assert len(names) == len(set(names)) == 6 + 5 + 7 * 3 + 2 + 1 + 3 * halves
    for name in ("softmax (8,128,2048) bool mask", "matmul n=1024", "sdpa (8,8,128,64)",
                 "sdpa (1,8,2048,64) causal", "sdpa (1,1,8192,64) padding mask",
                 "decode B=1 H=32 L=1 S=4096 E=128", "decode B=1 H=32 L=1 S=512 E=128",
                 "tiny (1,1,8,8)"):
        assert name in names
    quick = [s.name for s in _bench.build_specs(quick=True)]
    assert set(quick) < set(names) and "tiny (1,1,8,8)" in quick
    picked = _bench.select_specs(_bench.build_specs(), ["SDPA (1,1,8192", "decode"])
    assert [s.name for s in picked] == ["sdpa (1,1,8192,64)", "sdpa (1,1,8192,64) causal",
                                        "sdpa (1,1,8192,64) padding mask",
                                        "decode B=1 H=32 L=1 S=4096 E=128"] + [
        f"decode B=1 H=32 L=1 S=4096 E=128 {h}" for h in _bench.cases.half_formats()] + [
        "decode B=1 H=32 L=1 S=512 E=128"]
    for h in _bench.cases.half_formats():
        assert f"sdpa (1,8,2048,64) {h}" in names and f"sdpa (1,8,512,64) {h}" not in quick


def test_full_bench_cases_agree():
    """Every implementation of a few small cases gives cyattn's result."""
    specs = [_bench.Spec("softmax", (2, 3, 16), "mask"), _bench.Spec("matmul", (16,)),
             _bench.Spec("sdpa", (2, 2, 16, 16, 8), "padding"),
             _bench.Spec("sdpa", (1, 2, 16, 16, 8), "causal"),
             _bench.Spec("decode", (1, 2, 1, 32, 8), "dense"), _bench.Spec("tiny", (1, 1, 8, 8, 8)),
             _bench.Spec("decode", (1, 2, 1, 700, 8), "dense float16"),
             _bench.Spec("sdpa", (1, 2, 40, 40, 8), "dense float16")]
    for spec in specs:
        make, reference = _bench.prepare(spec, _bench.IMPLS + (_bench.KV_READ,))
        assert _bench.check_case(reference) == ([], {}), spec.name
        fns = make(1)
        assert {"cyattn"} | ({"numpy"} if spec.storage == "float32" else set()) <= set(fns)
        assert (_bench.KV_READ in fns) == (spec.group == "decode")
        for fn in fns.values():
            fn()


def _fake_result():
    """A run_full result with made-up times (seconds per call)."""
    def row(spec, threads, times):
        return {"case": spec.name, "spec": spec.to_json(), "threads": threads, "times": times,
                "differs": [], "errors": {}}
    sdpa = _bench.Spec("sdpa", (1, 8, 512, 512, 64), "dense")
    soft = _bench.Spec("softmax", (8, 128, 512))
    dec = _bench.Spec("decode", (1, 32, 1, 4096, 128), "dense")
    big = _bench.Spec("sdpa", (1, 1, 8192, 8192, 64), "dense")
    rows = []
    for n in (1, 2):
        # per-round torch/cyattn ratios 3, 1, 3: median 3.00 (the ratio of medians is 2.00)
        rows.append(row(sdpa, n, {"cyattn": [0.01, 0.02, 0.03], "numpy": [0.04] * 3,
                                  "torch": [0.03, 0.02, 0.09]}))
        rows.append(row(soft, n, {"cyattn": [1e-3] * 3, "numpy": [2e-3] * 3,
                                  "torch": [0.5e-3] * 3}))
        rows.append(row(dec, n, {"cyattn": [0.04] * 3, "numpy": [0.08] * 3,
                                 "torch": [0.02] * 3, _bench.KV_READ: [0.02] * 3}))
    meta = {"date": "2026-01-01T00:00:00", "cpu": "Test CPU", "logical_cpus": 2,
            "python": "3.x", "numpy": "2.x", "torch": "2.x", "cyattn": "0.1.0",
            "variant": "avx2", "available_variants": ["baseline", "avx2"], "cpu_features": [],
            "openmp": True, "impls": ["cyattn", "numpy", "torch"], "threads": [1, 2],
            "samples": 3, "target": 0.03, "pause": 0.2, "limits_active": True,
            "fma_peak_gflops": 100.0, "bandwidth_gbs": {"1": 10.0, "2": 16.0},
            "bandwidth_bytes": 128 * 2 ** 20, "memory_threads": 2, "notes": ["a note"],
            "elapsed_s": 12.0}
    mem = [{"case": big.name, "spec": big.to_json(), "threads": 2, "out_mib": 2.0,
            "impls": {"cyattn": {"growth_mib": 4.0}, "numpy": {"growth_mib": 770.0},
                      "torch": {"error": "boom"}}}]
    return {"meta": meta, "rows": rows, "memory": mem}


def test_full_bench_markdown():
    text = _bench.render_markdown(_fake_result())
    assert "FMA peak: **100 GFLOP/s per core**" in text
    assert "- a note" in text
    assert re.search(r"^\| target \| case \| 1 thread \| 2 threads \|$", text, re.M)
    # the paired ratio is the median of the per-round ratios, not the ratio of the medians
    flops = 4 * 8 * 512 * 512 * 64
    gf_cy = flops / 0.02 / 1e9
    assert re.search(r"^\| SDPA T ≥ 512 vs torch \| sdpa \(1,8,512,64\) \| \*\*3\.00×\*\* "
                     r"\(cyattn 26\.8, torch 17\.9 GFLOP/s\) \|", text, re.M)
    assert f"{gf_cy:.1f}" == "26.8"
    row1 = next(line for line in text.splitlines() if line.startswith("| sdpa (1,8,512,64) | 1 |"))
    cells = [c.strip() for c in row1.strip("|").split("|")]
    assert cells[2] == "20.0 ms (10.0–30.0)"                      # cyattn median (min–max)
    assert cells[5:7] == ["2.00×", "3.00×"]                       # vs numpy, vs torch
    assert cells[7] == "26.8 (27 %)"                              # GFLOP/s (% of 100 × 1)
    row2 = next(line for line in text.splitlines() if line.startswith("| sdpa (1,8,512,64) | 2 |"))
    assert "26.8 (13 %)" in row2                                  # % of 100 × 2 threads
    assert "| softmax (8,128,512) | 1 | 1.00 ms (1.00–1.00) |" in text
    assert "**0.50×** (cyattn 1.91, torch 0.95 ns/el)" in text    # 1e-3 s / 524288 elements
    # decode: K+V GB/s and percent of the paired NumPy read of K and V
    assert "**cyattn 3.36 GB/s = 50 %**" in text and "torch 6.71 GB/s = 100 %" in text
    # memory: growth vs the output size, errors listed
    assert "**4.00 MiB = 2.0×** the 2.00 MiB output (numpy 770 MiB)" in text
    assert "| sdpa (1,1,8192,64) | 2.00 MiB | 4.00 MiB | 770 MiB | error | 2.0× |" in text
    assert "- sdpa (1,1,8192,64), torch: boom" in text
    # without torch there is no torch column
    res = _fake_result()
    res["meta"]["impls"] = ["cyattn", "numpy"]
    text = _bench.render_markdown(res)
    assert "vs torch" not in text and "| vs numpy |" in text


def test_full_bench_plot(tmp_path):
    pytest.importorskip("matplotlib")
    path = _bench.write_plot(_fake_result(), tmp_path / "p.png")
    assert path is not None and (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_full_bench_machine_measurements():
    class NoProbe:
        pass

    class FakeProbe:
        @staticmethod
        def fma_probe(iters):
            return 2 * iters, 0.0
    assert _bench.measure_fma_peak(NoProbe()) is None
    assert _bench.measure_fma_peak(FakeProbe(), target=0.001, repeats=2) > 0
    if hasattr(cyattn._backend.kernels, "fma_probe"):
        assert _bench.measure_fma_peak(target=0.01, repeats=1) > 0
    assert _bench.measure_read_bandwidth(1 << 20, 1, repeats=2) > 0
    assert _bench.measure_read_bandwidth(1 << 20, 2, repeats=2) > 0


@pytest.mark.skipif(not _bench.memory_supported(), reason="peak memory needs Linux /proc")
def test_full_bench_memory_child():
    res = _bench.measure_memory(_bench.Spec("tiny", (1, 1, 8, 8, 8), "dense"), "cyattn", 1)
    assert "error" not in res, res
    assert res["growth_mib"] >= 0
    res = _bench.measure_memory(_bench.Spec("matmul", (64,)), "numpy", 1)
    assert res["growth_mib"] >= 0
    bad = _bench.measure_memory(_bench.Spec("matmul", (64,)), "nonsense", 1)
    assert "error" in bad
    # a peer with no implementation of the case (NumPy has no float16 attention) is skipped,
    # not reported as an error (it was, before)
    res = _bench.measure_memory(_bench.Spec("decode", (1, 2, 1, 64, 16), "dense float16"),
                                "numpy", 1)
    assert "skipped" in res and "error" not in res, res


def test_full_bench_runs_in_process():
    spec = _bench.Spec("tiny", (1, 1, 8, 8, 8), "dense")
    res = _bench.run_full([spec], threads=(1,), samples=2, target=0.0, memory=False,
                          progress=False)
    (row,) = res["rows"]
    assert row["case"] == "tiny (1,1,8,8)" and row["errors"] == {} and row["differs"] == []
    assert set(row["times"]) == set(res["meta"]["impls"])
    assert all(len(t) == 2 for t in row["times"].values())
    assert "tiny (1,1,8,8)" in _bench.render_markdown(res)


def test_bench_full_tiny_command(tmp_path):
    out = tmp_path / "out"
    proc = run_cli(tmp_path, *_TINY_FULL, "--no-torch", "--outdir", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"bench: wrote {out / 'latest.md'}, {out / 'latest.json'}" in proc.stdout
    assert "PNG plot skipped (no SDPA case)" in proc.stdout
    text = (out / "latest.md").read_text(encoding="utf-8")
    assert re.search(r"^\| tiny \(1,1,8,8\) \| 1 \| .* µs", text, re.M)
    assert "torch" not in text.split("## Targets")[1]
    import json
    data = json.loads((out / "latest.json").read_text())
    assert [r["case"] for r in data["rows"]] == ["tiny (1,1,8,8)"]
    if _bench.memory_supported():
        assert "## Peak memory growth" in text
        assert "growth_mib" in data["memory"][0]["impls"]["cyattn"]


def test_bench_full_outdir_outside_a_checkout(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(_bench, "checkout_root", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert _bench.default_outdir() == tmp_path
    assert cli.main(_TINY_FULL + ["--no-torch", "--no-memory"]) == 0
    out = capsys.readouterr().out
    assert "not imported from a checkout" in out
    assert f"bench: wrote {tmp_path / 'latest.md'}" in out
    assert (tmp_path / "latest.md").is_file() and (tmp_path / "latest.json").is_file()
    monkeypatch.setattr(_bench, "checkout_root", lambda: tmp_path / "repo")
    assert _bench.default_outdir() == tmp_path / "repo" / "bench" / "results"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--outdir", "x"], "--outdir needs --full"),
    (["bench", "--no-torch"], "--no-torch needs --full"),
    (["bench", "--threads", "1,2"], "the quick bench takes one thread count"),
    (["bench", "--threads", "0"], "bench --threads"),
    (["bench", "--full", "--cases", "nope"], "unknown group"),
    (["bench", "--full", "--threads", "1,x"], "--threads"),
])
def test_bench_option_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_full_no_matching_case(capsys):
    assert cli.main(["bench", "--full", "--only", "no such case", "--no-torch"]) == 2
    assert "no case matches" in capsys.readouterr().err


@pytest.mark.skipif("avx2" not in cyattn._backend.cpu_features(),
                    reason="sets OPENBLAS_CORETYPE=Haswell, which runs AVX2 code in NumPy")
def test_bench_full_reexecs_without_openblas_overrides(tmp_path):
    env = child_env()
    env["OPENBLAS_L2_SIZE"] = "262144"
    proc = subprocess.run([sys.executable, "-m", "cyattn", *_TINY_FULL, "--no-torch",
                           "--no-memory", "--outdir", str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300 * timeout_scale())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OPENBLAS_L2_SIZE=262144 is set" in proc.stdout
    assert "Re-run in a child process without" in (tmp_path / "latest.md").read_text("utf-8")


_RUN_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench",
                       "run.py")


@pytest.mark.skipif(not os.path.isfile(_RUN_PY), reason="bench/run.py is in the repository only")
def test_bench_run_py_help(tmp_path):
    proc = subprocess.run([sys.executable, _RUN_PY, "--help"], cwd=tmp_path, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--outdir" in proc.stdout and "--only" in proc.stdout


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out
