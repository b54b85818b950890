"""How cyattn's kernels and the sentence encoder split a call's work among threads (private).

A pure-Python mirror of the kernels' task-split rules, to see a call's plan for any thread
count on any machine (``python -m cyattn info --plan``): how many tasks, how much work each
(multiply-adds, or elements for the row passes), which thread runs which, and so how busy the
busiest thread is. It mirrors, and tests hold it to (``tests/test_plan.py``; the constants are
read from the compiled module, :func:`constants`):

- matmul (``matmul_tiles`` and ``matmul_tasks``, ``_gemm.pxi``): the output is cut into tiles,
  halved along the longer side until every thread has two; worker w takes tiles w, w + n, ...;
  at most ``M N K / 2^18`` threads (``threads_for_work``).
- attention (``attention_run``, ``_entry_attention.pxi``): fused tasks are (batch entry, group
  of up to QG_DENSE query rows, or QG for heads with E + Ev > 256), groups halved down to 64
  rows until every thread has 2 tasks (8 with a causal mask); worker w takes tasks w, w + n,
  ...; a task costs its rows' visible keys times E + Ev. A few query rows (L <= DECODE_MAX_L,
  more than DECODE_UNGROUPED_MAX_L only against S >= L GDECODE_KEYS_PER_ROW keys) take the
  decode path (``decode_dispatch``): with one query head per K/V head, at most
  DECODE_UNGROUPED_MAX_L rows and no 8-bit K/V, (batch entry, chunk of DECODE_CHUNK keys) tasks
  in contiguous static blocks (``_attention_decode.pxi``); else the grouped decode
  (``_attention_decode_grouped.pxi``): (K/V head, block of up to GDECODE_MAX_ROWS // L of its
  ``group`` query heads, chunk) tasks, the chunk GDECODE_CHUNK keys halved down to
  GDECODE_MIN_CHUNK while there are fewer than GDECODE_MIN_TASKS tasks. At most
  ``batch L S (E + Ev + 8) / 2^18`` threads.
- row passes (GELU, LayerNorm, ``_encoder_rows.pxi``): contiguous static blocks of rows, at most
  ``rows width / ROWS_PER_THREAD_ELEMS`` threads.
- the encoder (``Encoder.encode``): ``min(n_threads, batches)`` lanes run batches longest
  first and share the threads among the lanes still running (:func:`encode_plan` simulates
  it, kernel by kernel, with each kernel taking its busiest thread's work as its time).

The work measures are the kernels' arithmetic only: no memory traffic, packing or team
start-up, so a balanced plan is necessary for a fast call, not sufficient.
"""
from __future__ import annotations

import heapq

from . import _backend

__all__ = []

_PER_THREAD = 1 << 18          # threads_for_work's unit (matmul and attention)


def constants():
    """The compiled module's task-split constants (tiles, query groups, decode chunks, ...)."""
    return _backend.kernels.plan_constants()


def _threads_for_work(n_threads, work):
    return max(1, min(n_threads, work // _PER_THREAD))


class Plan:
    """One kernel call's split: ``tasks`` (work per task), ``owner`` (the thread running
    each), ``threads`` used of ``n_threads`` asked for.

    Attributes
    ----------
    name : str
    n_threads : int
        Threads the call was given.
    threads : int
        Threads it uses (capped by its work and its task count).
    tasks : list of int
        Work of each task (multiply-adds; elements for row passes).
    loads : list of int
        Work of each of the ``threads`` threads.
    """

    __slots__ = ("name", "n_threads", "threads", "tasks", "loads")

    def __init__(self, name, n_threads, threads, tasks, owner):
        self.name = name
        self.n_threads = n_threads
        self.threads = threads
        self.tasks = tasks
        self.loads = [0] * threads
        for work, w in zip(tasks, owner):
            self.loads[w] += work

    @property
    def work(self):
        return sum(self.tasks)

    @property
    def largest_task(self):
        """The largest task over the mean task."""
        return max(self.tasks) * len(self.tasks) / self.work if self.work else 1.0

    @property
    def largest_share(self):
        """The largest task's share of the call's work."""
        return max(self.tasks) / self.work if self.work else 0.0

    @property
    def span(self):
        """The busiest thread's work: the call's time at one unit of work per thread."""
        return max(self.loads) if self.loads else 0

    @property
    def spread(self):
        """The busiest thread's work over the mean of the threads used."""
        return self.span * self.threads / self.work if self.work else 1.0

    @property
    def balance(self):
        """The busiest thread's work over an even share for ``n_threads`` (1.0: every thread
        equally busy; threads left idle count)."""
        return self.span * self.n_threads / self.work if self.work else 1.0

    def row(self):
        return (f"{self.name:<40} {len(self.tasks):>6} {self.threads:>4}/{self.n_threads:<4} "
                f"{self.largest_task:>6.2f} {self.largest_share:>7.1%} {self.balance:>6.2f}")


HEADER = (f"{'call':<40} {'tasks':>6} {'threads':>9} {'max/mean':>6} {'share':>7} "
          f"{'busy':>6}\n" + "-" * 80)
_LEGEND = ("tasks: the call's tasks; threads: used/given; max/mean: the largest task over the "
           "mean task;\nshare: the largest task's share of the work; busy: the busiest "
           "thread's work over an even share\nfor the threads given (1.00 = perfect; idle "
           "threads count)")


def _static_blocks(n_items, threads):
    """Owner of each item under OpenMP's static schedule without a chunk size (contiguous
    blocks, the first ``n_items % threads`` one item larger: GNU OpenMP's split)."""
    q, r = divmod(n_items, threads)
    owner = []
    for w in range(threads):
        owner += [w] * (q + (w < r))
    return owner


def matmul(M, N, K, n_threads, *, dtype="float32", name=None, consts=None):
    """The plan of ``out (M, N) += a (M, K) @ b (K, N)`` (matmul_accumulate, or the encoder's
    packed weights) on ``n_threads``."""
    c = consts or constants()
    mr, nr = (c["MR"], c["NR"]) if dtype == "float32" else (c["MRD"], c["NRD"])
    threads = _threads_for_work(n_threads, M * N * K)

    def up(x, m):
        return -(-x // m) * m
    tm, tn = up(M, mr), up(min(N, c["NC"]), nr)
    want = 2 * threads if threads > 1 else 1

    def count(tm, tn):
        return -(-M // tm) * -(-N // tn)
    while count(tm, tn) < want:
        if tm > mr and (tm >= tn or tn <= nr):
            tm = up(tm // 2, mr)
        elif tn > nr:
            tn = up(tn // 2, nr)
        else:
            break
    tiles_m, tiles_n = -(-M // tm), -(-N // tn)
    threads = min(threads, tiles_m * tiles_n)
    tasks = []
    for t in range(tiles_m * tiles_n):
        ti, tj = t // tiles_n, t % tiles_n
        tasks.append(min(tm, M - ti * tm) * min(tn, N - tj * tn) * K)
    owner = [t % threads for t in range(len(tasks))]
    return Plan(name or f"matmul {M}x{N}x{K}", n_threads, threads, tasks, owner)


def attention(batch, L, S, E, Ev, n_threads, *, causal=False, lengths=None, name=None,
              consts=None, group=1, kv8=False):
    """The plan of one attention kernel call: ``batch`` independent (L, S) problems (batch x
    query heads), head dims E and Ev; ``lengths``: per batch entry, each entry's key and query
    length (the encoder's ragged call), else L and S; ``group``: query heads per K/V head
    (GQA, dividing ``batch``); ``kv8``: 8-bit K/V, which only the grouped decode reads."""
    c = consts or constants()
    if lengths is None:
        work = batch * L * S * (E + Ev + 8)
    else:
        work = sum(n * n for n in lengths) * (E + Ev + 8)
    threads = _threads_for_work(n_threads, work)
    decode = (0 < L <= c["DECODE_MAX_L"] and batch * S * (E + Ev) >= L * c["DECODE_MIN_WORK"]
              and (L <= c["DECODE_UNGROUPED_MAX_L"] or S >= L * c["GDECODE_KEYS_PER_ROW"]))
    if decode and (group > 1 or L > c["DECODE_UNGROUPED_MAX_L"] or kv8):
        if group < 1 or batch % group:
            raise ValueError(f"group={group} must divide batch={batch}")
        hg = min(max(c["GDECODE_MAX_ROWS"] // L, 1), group)      # query heads per task
        nhb = -(-group // hg)
        ngroups = batch // group
        chunk = c["GDECODE_CHUNK"]
        while chunk > c["GDECODE_MIN_CHUNK"] and ngroups * nhb * -(-S // chunk) < \
                c["GDECODE_MIN_TASKS"]:
            chunk //= 2
        chunks = -(-S // chunk)
        tasks = [min(hg, group - hb * hg) * L * min(chunk, S - j * chunk) * (E + Ev)
                 for _ in range(ngroups) for hb in range(nhb) for j in range(chunks)]
        threads = min(threads, len(tasks))
        return Plan(name or f"grouped decode {batch}/{group}x{L}x{S}", n_threads, threads,
                    tasks, _static_blocks(len(tasks), threads))
    if decode:
        chunk = c["DECODE_CHUNK"]
        chunks = -(-S // chunk)
        tasks = [L * min(chunk, S - j * chunk) * (E + Ev)
                 for _ in range(batch) for j in range(chunks)]
        threads = min(threads, len(tasks))
        return Plan(name or f"decode {batch}x{L}x{S}", n_threads, threads, tasks,
                    _static_blocks(len(tasks), threads))
    qg = c["QG_DENSE"] if E + Ev <= 256 else c["QG"]
    per_thread = 8 if threads > 1 and causal else 2
    while qg > 64 and batch * -(-L // qg) < per_thread * threads:
        qg //= 2
    groups = -(-L // qg)
    threads = min(threads, batch * groups)
    tasks = []
    for t in range(batch * groups):
        bi, i0 = t % batch, (t // batch) * qg
        lq = L if lengths is None else min(lengths[bi], L)
        lk = S if lengths is None else min(lengths[bi], S)
        rows = range(i0, min(i0 + qg, lq))
        keys = sum(min(lk, i + 1) for i in rows) if causal else len(rows) * lk
        tasks.append(keys * (E + Ev))
    owner = [t % threads for t in range(len(tasks))]
    return Plan(name or f"sdpa {batch}x{L}x{S}", n_threads, threads, tasks, owner)


def rows(n_rows, width, n_threads, *, name=None, consts=None):
    """The plan of a row pass (GELU or LayerNorm) over ``n_rows`` rows of ``width``."""
    c = consts or constants()
    most = n_rows * width // c["ROWS_PER_THREAD_ELEMS"]
    threads = 1 if most < 1 else min(n_threads, most)
    owner = _static_blocks(n_rows, threads)
    return Plan(name or f"rows {n_rows}x{width}", n_threads, threads, [width] * n_rows, owner)


# all-MiniLM-L6-v2's shape: hidden 384, 12 heads of 32, FFN 1536, 6 layers
MINILM = {"hidden": 384, "heads": 12, "intermediate": 1536, "layers": 6}
_SHORT_RUN = 4                 # as cyattn.encoder._bert._SHORT_RUN


def encoder_batch(lengths, n_threads, *, model=MINILM, consts=None):
    """The kernel calls of one layer of the encoder's forward pass over one batch of texts of
    ``lengths`` tokens (sorted, longest first), each on ``n_threads``."""
    c = consts or constants()
    E, H, F = model["hidden"], model["heads"], model["intermediate"]
    D = E // H
    lengths = sorted(lengths, reverse=True)
    T, L = sum(lengths), max(lengths)
    runs = {}
    for n in lengths:
        runs[n] = runs.get(n, 0) + 1
    plans = [matmul(T, 3 * E, E, n_threads, name=f"qkv projection {T}x{3 * E}x{E}", consts=c)]
    if len(runs) > 1 and L > _SHORT_RUN:
        plans.append(attention(len(lengths) * H, L, L, D, D, n_threads,
                               lengths=[n for n in lengths for _ in range(H)],
                               name=f"attention {len(lengths)}x{H}x(<={L}), ragged", consts=c))
    else:
        for n, g in runs.items():
            for _ in range(g if n <= _SHORT_RUN else 1):
                k = 1 if n <= _SHORT_RUN else g
                plans.append(attention(k * H, n, n, D, D, n_threads,
                                       name=f"attention {k}x{H}x{n}", consts=c))
    plans += [matmul(T, E, E, n_threads, name=f"output projection {T}x{E}x{E}", consts=c),
              rows(T, E, n_threads, name=f"layernorm {T}x{E}", consts=c),
              matmul(T, F, E, n_threads, name=f"ffn1 {T}x{F}x{E}", consts=c),
              rows(T, F, n_threads, name=f"gelu {T}x{F}", consts=c),
              matmul(T, E, F, n_threads, name=f"ffn2 {T}x{E}x{F}", consts=c),
              rows(T, E, n_threads, name=f"layernorm {T}x{E}", consts=c)]
    return plans


# A row pass's element costs about as much time as this many multiply-adds of a GEMM
# (measured on a Zen 5 core: GELU 0.6 ns, LayerNorm 0.18 ns per element, GEMMs ~100 GMAC/s)
_ROW_ELEMENT_MACS = {"gelu": 60, "layernorm": 18}


def _kernel_time(plan):
    """A kernel's time in multiply-add units: its busiest thread's work."""
    for key, macs in _ROW_ELEMENT_MACS.items():
        if plan.name.startswith(key):
            return plan.span * macs
    return plan.span


def batch_time(lengths, n_threads, *, model=MINILM, consts=None):
    """Modelled time of one forward pass over a batch at ``n_threads`` (multiply-add units)."""
    return model["layers"] * sum(_kernel_time(p) for p in
                                 encoder_batch(lengths, n_threads, model=model, consts=consts))


class EncodePlan:
    """The modelled run of ``Encoder.encode`` over ``batches`` (lists of token lengths,
    longest batch first) on ``n_threads``: lanes, and per batch its lane and start/end.

    Attributes
    ----------
    lanes : int
    makespan : float
        Modelled time of the call (multiply-add units, one unit per thread).
    ideal : float
        Time at one thread over ``n_threads`` (every thread busy, no imbalance).
    balance : float
        ``makespan / ideal``.
    largest_task : float
        The costliest batch (at one thread) over the mean batch.
    largest_share : float
        The costliest batch's share of the call's work.
    """

    def __init__(self, batches, n_threads, *, model=MINILM, consts=None):
        c = consts or constants()
        self.n_threads = n_threads
        self.batches = batches
        self.lanes = lanes = min(n_threads, len(batches))
        costs = [batch_time(b, 1, model=model, consts=c) for b in batches]
        self.ideal = sum(costs) / n_threads
        self.largest_task = max(costs) * len(costs) / sum(costs)
        self.largest_share = max(costs) / sum(costs)
        # kernel-level simulation of the lanes sharing the threads (Encoder._encode_lanes)
        layer_cache = {}

        def kernels(b, t):
            key = (tuple(batches[b]), t)
            if key not in layer_cache:
                layer_cache[key] = [_kernel_time(p) for p in
                                    encoder_batch(batches[b], t, model=model, consts=c)]
            return layer_cache[key]

        running = list(range(lanes))

        def share(lane):
            q, extra = divmod(n_threads, len(running))
            return q + (running.index(lane) < extra)

        queue = list(range(lanes, len(batches)))
        state = {i: [i, 0] for i in range(lanes)}       # lane -> [batch, next kernel index]
        n_kernels = model["layers"] * len(kernels(0, 1))
        events = [(0.0, i) for i in range(lanes)]
        self.spans = {}
        start = {i: 0.0 for i in range(lanes)}
        now = 0.0
        while events:
            now, lane = heapq.heappop(events)
            b, k = state[lane]
            if k == n_kernels:                          # batch done: next one, or leave
                self.spans[b] = (lane, start[lane], now)
                if queue:
                    b, k = queue.pop(0), 0
                    state[lane] = [b, 0]
                    start[lane] = now
                else:
                    running.remove(lane)
                    continue
            per_layer = kernels(b, share(lane))
            heapq.heappush(events, (now + per_layer[k % len(per_layer)], lane))
            state[lane][1] = k + 1
        self.makespan = now
        self.balance = self.makespan / self.ideal if self.ideal else 1.0

    def row(self, name):
        return (f"{name:<40} {len(self.batches):>6} {self.lanes:>4}L/{self.n_threads:<3} "
                f"{self.largest_task:>6.2f} {self.largest_share:>7.1%} {self.balance:>6.2f}")


# The bench's shapes (bench/bench_minilm.py, bench/run.py): token lengths of one request of
# 32 short texts (bench_minilm.short_texts(32)), the batches of the 400-text mix
# (bench_texts(400), batch 32; tests/test_plan.py checks these against the tokenizer), and
# the 2-core proxy of issue 41 (3 batches of 32 texts of 256, 64 and 16 tokens).
REQUEST = [14] * 3 + [13] * 3 + [12] * 10 + [11] * 6 + [10] * 4 + [9] * 5 + [8]
SPREAD = [[256] * 32, [64] * 32, [16] * 32]


def batches_of(lengths, batch_size=32):
    """``lengths`` sorted longest first and cut into batches, as Encoder.encode does."""
    order = sorted(lengths, reverse=True)
    return [order[s:s + batch_size] for s in range(0, len(order), batch_size)]


def bench_shapes(n_threads, mix=None, consts=None):
    """(name, plan) of issue 41's bench shapes at ``n_threads``: SDPA (1, 8, 2048, 64), decode
    (1, 32, 1, 4096, 128), the encoder's one request (per kernel, and the kernels of a layer
    together), the 2-core proxy's 3 batches, and the mix's batches when ``mix`` (token
    lengths of its texts) is given."""
    c = consts or constants()
    out = [("sdpa (1,8,2048,64)", attention(8, 2048, 2048, 64, 64, n_threads, consts=c)),
           ("sdpa causal (1,8,2048,64)",
            attention(8, 2048, 2048, 64, 64, n_threads, causal=True, consts=c)),
           ("decode (1,32,1,4096,128)", attention(32, 1, 4096, 128, 128, n_threads, consts=c)),
           ("GQA decode (8,32/8,1,4096,128)",
            attention(8 * 32, 1, 4096, 128, 128, n_threads, consts=c, group=4)),
           ("GQA decode (1,32/8,1,32768,128)",
            attention(32, 1, 32768, 128, 128, n_threads, consts=c, group=4)),
           ("GQA decode (1,32/8,8,4096,128)",
            attention(32, 8, 4096, 128, 128, n_threads, consts=c, group=4))]
    for p in encoder_batch(REQUEST, n_threads, consts=c):
        out.append(("request " + p.name, p))
    out.append(("encode: request of 32 short texts", EncodePlan([REQUEST], n_threads, consts=c)))
    out.append(("encode: 3 batches of 256/64/16", EncodePlan(SPREAD, n_threads, consts=c)))
    if mix is not None:
        out.append((f"encode: mix of {len(mix)} texts",
                    EncodePlan(batches_of(mix), n_threads, consts=c)))
    return out


def report(n_threads, shapes=None):
    """The plan table (str) of ``shapes`` (bench_shapes(n) by default) at each of
    ``n_threads`` (an int or a list)."""
    counts = [n_threads] if isinstance(n_threads, int) else list(n_threads)
    lines = [_LEGEND, "encode rows: tasks are batches, threads are lanes/threads, busy is the "
             "modelled call time over the\nideal (kernel by kernel, each kernel at its "
             "busiest thread's work; no overheads)"]
    for n in counts:
        lines += ["", f"n_threads = {n}", HEADER]
        for name, plan in (shapes(n) if shapes else bench_shapes(n)):
            lines.append(plan.row(name) if isinstance(plan, EncodePlan) else
                         f"{name:<40}" + plan.row()[40:])
    return "\n".join(lines)
