"""The full bench's peer check: an implementation whose result differs from cyattn's (or that
raises) is reported in the row and the report, and never timed. Also the optional peers
(ONNX Runtime, JAX) against cyattn on small cases, when installed. No timing assertions."""
import numpy as np
import pytest

import cyattn
from cyattn import _bench
from cyattn._bench import runner


def _case(calls):
    """make/reference over a softmax input: "cyattn", a "good" peer (NumPy's softmax), a
    "wrong" one (softmax of 2x) and a "raises" one; ``calls`` counts the timed calls."""
    x = np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32)

    def counted(name, fn):
        def call():
            calls[name] = calls.get(name, 0) + 1
            return fn()
        return call

    def boom():
        raise RuntimeError("no kernel for this shape")
    results = {"cyattn": lambda: cyattn.softmax(x), "good": lambda: _bench.np_softmax(x),
               "wrong": lambda: _bench.np_softmax(2 * x), "raises": boom}

    def make(n_threads):
        return {name: counted(name, fn) for name, fn in results.items()}
    return make, lambda: dict(results)


def test_wrong_peer_is_reported_not_timed():
    calls = {}
    make, reference = _case(calls)
    row = runner.time_case(make, reference, 1, samples=3, target=0.0)
    assert row["differs"] == ["wrong"]
    assert row["errors"]["wrong"].startswith("wrong result, not timed: max |difference")
    assert row["errors"]["raises"] == "RuntimeError: no kernel for this shape"
    assert set(row["times"]) == {"cyattn", "good"}
    assert all(len(t) == 3 for t in row["times"].values())
    # the timed calls of the wrong and the failing peer never ran
    assert "wrong" not in calls and "raises" not in calls
    assert calls["good"] >= 3 and calls["cyattn"] >= 3


def test_wrong_peer_in_the_report():
    make, reference = _case({})
    spec = _bench.Spec("softmax", (1, 4, 32))
    row = {"case": spec.name, "spec": spec.to_json(), "threads": 1,
           **runner.time_case(make, reference, 1, samples=2, target=0.0)}
    meta = {"date": "2026-01-01T00:00:00", "cpu": "Test CPU", "logical_cpus": 2,
            "python": "3.x", "numpy": "2.x", "cyattn": "0.1.0", "variant": "avx2",
            "available_variants": ["avx2"], "cpu_features": [], "openmp": True,
            "impls": ["cyattn", "good", "wrong", "raises"], "threads": [1], "samples": 2,
            "target": 0.0, "pause": 0.0, "limits_active": True, "fma_peak_gflops": None,
            "bandwidth_gbs": {"1": 10.0}, "bandwidth_bytes": 2 ** 20, "notes": [],
            "elapsed_s": 1.0}
    text = _bench.render_markdown({"meta": meta, "rows": [row], "memory": []})
    line = next(s for s in text.splitlines() if s.startswith("| softmax (1,4,32) | 1 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4:6] == ["wrong result", "error"]           # the wrong and the failing peer
    assert "- softmax (1,4,32), 1 thread(s), wrong: wrong result, not timed" in text
    assert "- softmax (1,4,32), 1 thread(s), raises: RuntimeError: no kernel" in text


def test_check_case_details():
    ref = np.ones((2, 3), np.float32)
    details = {}
    differs, errors = _bench.check_case(lambda: {
        "cyattn": lambda: ref, "same": lambda: ref.copy(), "shape": lambda: ref[:1],
        "nan": lambda: np.full_like(ref, np.nan)}, details)
    assert sorted(differs) == ["nan", "shape"] and errors == {}
    assert details["shape"] == "result of shape (1, 3), cyattn's is (2, 3)"
    assert "6 more NaN" in details["nan"]


_SPECS = [_bench.Spec("softmax", (2, 3, 16)), _bench.Spec("softmax", (2, 3, 16), "mask"),
          _bench.Spec("matmul", (24,)), _bench.Spec("sdpa", (2, 2, 16, 16, 8), "dense"),
          _bench.Spec("sdpa", (1, 2, 16, 16, 8), "causal"),
          _bench.Spec("sdpa", (2, 2, 16, 16, 8), "padding"),
          _bench.Spec("decode", (1, 2, 1, 32, 8), "dense")]


@pytest.mark.parametrize("peer, modules", [("ort", ("onnx", "onnxruntime")), ("jax", ("jax",))])
@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.name)
def test_peer_agrees_with_cyattn(peer, modules, spec):
    for m in modules:
        pytest.importorskip(m)
    make, reference = _bench.prepare(spec, ("cyattn", peer))
    assert _bench.check_case(reference) == ([], {})
    fns = make(2)
    assert set(fns) == {"cyattn", peer}
    fns[peer]()


def test_wrong_ort_attention_is_caught():
    """A real peer with a wrong result: ONNX Runtime's causal Attention against cyattn's
    dense attention is reported as differing."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from cyattn._bench import peers
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 16, 8)).astype(np.float32) for _ in range(3))
    causal_call, causal_result = peers.ort_attention(q, k, v, None, True, 8 ** -0.5, 1)
    make = lambda n: {"cyattn": lambda: cyattn.scaled_dot_product_attention(q, k, v),
                      "ort": causal_call}
    reference = lambda: {"cyattn": lambda: cyattn.scaled_dot_product_attention(q, k, v),
                         "ort": causal_result}
    row = runner.time_case(make, reference, 1, samples=1, target=0.0)
    assert row["differs"] == ["ort"] and set(row["times"]) == {"cyattn"}


def test_jax_column_in_its_own_process():
    pytest.importorskip("jax")
    spec = _bench.Spec("tiny", (1, 1, 8, 8, 8), "dense")
    res = _bench.run_full([spec], threads=(1,), samples=2, target=0.0, memory=False,
                          progress=False, use_torch=False, use_ort=False, use_jax=True)
    (row,) = res["rows"]
    assert row["errors"] == {} and set(row["times"]) == {"cyattn", "numpy", "jax"}
    assert res["meta"]["peer_versions"]["jax"]
    assert any("NPROC" in note for note in res["meta"]["notes"])


def test_command_in_the_report():
    from cyattn._bench import cli
    assert cli.command_line(["-m", "cyattn", "bench", "--full"]) == "python -m cyattn bench --full"
    assert cli.command_line(["-m", "cyattn", "bench", "--full", "--only", "sdpa (1,8"]).endswith(
        "--only 'sdpa (1,8'")
