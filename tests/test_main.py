"""``python -m cyattn``: info, check, the default command (with a tiny bench) and main().

The command line runs in a subprocess (``sys.executable``) from a temporary working directory,
so it uses the same cyattn this test session imported. No timing assertions.
"""
import os
import re
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import cyattn
from cyattn import __main__ as cli
from cyattn import _bench, _selfcheck


def _env():
    env = dict(os.environ)
    # Make the child import the same cyattn as this process when it comes from a source tree
    # (an installed package is found by the child on its own).
    parent = os.path.dirname(os.path.dirname(os.path.abspath(cyattn.__file__)))
    site = {os.path.abspath(sysconfig.get_paths()[k]) for k in ("purelib", "platlib")}
    if parent not in site:
        env["PYTHONPATH"] = os.pathsep.join(
            [parent] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def run_cli(tmp_path, *args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "cyattn", *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=timeout)
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
    env = _env()
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
    assert _bench.paired_ratio([2.0, 4.0, 6.0], [1.0, 1.0, 2.0]) == 3.0
    assert _bench.summary([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    np.testing.assert_allclose(_bench.np_softmax(x), cyattn.softmax(x), rtol=1e-5)
    assert _bench.blas_env_overrides({"OPENBLAS_L2_SIZE": "1", "PATH": "x"}) == {
        "OPENBLAS_L2_SIZE": "1"}
    env = _bench.child_env(remove=("OPENBLAS_CORETYPE",), extra={"X_TEST": "1"})
    assert "OPENBLAS_CORETYPE" not in env and env["X_TEST"] == "1"


def test_bench_full_without_harness(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_full_harness", lambda: None)
    assert cli.main(["bench", "--full"]) == 1
    assert "not available in an installed package" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["bench", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 0
    assert "usage:" in capsys.readouterr().out
