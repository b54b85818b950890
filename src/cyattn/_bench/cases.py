"""The cases of the full harness and their implementations.

:class:`Spec` names one case (group, shape, kind) and derives its FLOPs, bytes and name;
:func:`build_specs` is the case table of ``bench --full`` (``--quick``: a subset);
:func:`prepare` allocates a case's inputs and returns the timed calls of each implementation
(cyattn, the NumPy code people write by hand, PyTorch when installed, and for decode a NumPy
read of K and V, the bandwidth yardstick); :func:`check_case` compares their results with
cyattn's before timing.
"""
import math
import zlib

import numpy as np

from .machine import read_once

IMPLS = ("cyattn", "numpy", "torch", "ort", "jax")       # ort: ONNX Runtime
PEERS = ("torch", "ort", "jax")                          # the optional ones
CHECK_RTOL, CHECK_ATOL = 2e-3, 2e-4      # a peer agrees with cyattn (float32 results)
# half-precision cases: both results are rounded to 8 (bfloat16) or 11 (float16) significant
# bits, and PyTorch rounds the weights to the half format before P V where cyattn does not
CHECK_HALF_RTOL, CHECK_HALF_ATOL = 3e-2, 3e-3
HALF_DTYPES = ("bfloat16", "float16")      # storage formats of the half cases (issue 19)
HALF_SDPA_T = (512, 2048)                  # sdpa (1, 8, T, T, 64) in each half format
KV_READ = "read K+V"         # decode only: NumPy reading K and V once, the bandwidth yardstick
FULL_GROUPS = ("softmax", "matmul", "sdpa", "decode", "tiny")
SOFTMAX_L = (128, 512, 2048)                       # x of shape (8, 128, L)
MATMUL_N = (16, 64, 256, 512, 1024)
SDPA_BHT = ((1, 1, 128), (8, 8, 128), (1, 8, 512), (1, 8, 1024), (1, 8, 2048), (1, 1, 4096),
            (1, 1, 8192))
SDPA_KINDS = ("dense", "causal", "padding")
HEAD_DIM = 64
DECODE_SHAPE = (1, 32, 1, 4096, 128)               # (B, H, L, S, E)
DECODE_SHORT_SHAPE = (1, 32, 1, 512, 128)          # early in generation: 512 cached positions
TINY_SHAPE = (1, 1, 8, 8, 8)                       # (B, H, L, S, E)
QUICK_SELECTION = {"softmax": (512,), "matmul": (64, 256, 1024),
                   "sdpa": ((8, 8, 128), (1, 8, 512))}
_MIB = 1024.0 * 1024.0


# ------------------------------------------------------------------------------------------
# NumPy references
# ------------------------------------------------------------------------------------------


def np_softmax(x):
    """Stable softmax over the last axis, the way NumPy code usually writes it."""
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_masked_softmax(x, mask):
    """Stable softmax over the last axis of the entries where ``mask`` is True."""
    return np_softmax(np.where(mask, x, np.array(-np.inf, dtype=x.dtype)))


def np_attention(q, k, v, scale, add_mask=None):
    """``softmax(q @ k^T * scale (+ add_mask)) @ v`` in NumPy."""
    s = q @ np.swapaxes(k, -1, -2)
    s *= s.dtype.type(scale)
    if add_mask is not None:
        s += add_mask
    return np_softmax(s) @ v


def sdpa_flops(B, H, L, S, E, causal=False):
    """Floating-point operations of attention: ``4 B H L S E`` (Q K^T and P V, a multiply and
    an add each), half of that when causal. A padding mask does not change the count."""
    flops = 4.0 * B * H * L * S * E
    return flops / 2 if causal else flops


class Spec:
    """One case of the full harness, rebuilt from ``(group, shape, kind)`` (also in a child
    process, see :func:`measure_memory`).

    ``group``: softmax (shape (8, 128, L), kind "" or "mask"), matmul (shape (n,)), sdpa /
    decode / tiny (shape (B, H, L, S, E), kind "dense", "causal" or "padding"). A kind may end
    in a half-precision storage format, e.g. "dense bfloat16": the inputs and result of the
    case are of that dtype (see :attr:`storage`).
    """

    __slots__ = ("group", "shape", "kind")

    def __init__(self, group, shape, kind=""):
        if group not in FULL_GROUPS:
            raise ValueError(f"unknown case group {group!r}")
        self.group, self.shape, self.kind = group, tuple(int(s) for s in shape), kind

    def to_json(self):
        return {"group": self.group, "shape": list(self.shape), "kind": self.kind}

    @classmethod
    def from_json(cls, d):
        return cls(d["group"], d["shape"], d.get("kind", ""))

    def __repr__(self):
        return f"Spec({self.group!r}, {self.shape}, {self.kind!r})"

    @property
    def storage(self):
        """The dtype name of the case's inputs and result: float32, or a half format."""
        last = self.kind.rsplit(" ", 1)[-1]
        return last if last in HALF_DTYPES else "float32"

    @property
    def itemsize(self):
        return 4 if self.storage == "float32" else 2

    @property
    def attention(self):
        return self.group in ("sdpa", "decode", "tiny")

    @property
    def name(self):
        s = self.shape
        if self.group == "softmax":
            return f"softmax ({s[0]},{s[1]},{s[2]})" + (" bool mask" if self.kind == "mask" else "")
        if self.group == "matmul":
            return f"matmul n={s[0]}"
        B, H, L, S, E = s
        half = "" if self.storage == "float32" else f" {self.storage}"
        if self.group == "decode":
            return f"decode B={B} H={H} L={L} S={S} E={E}{half}"
        if self.group == "tiny":
            return f"tiny ({B},{H},{L},{E})"
        kind = self.kind.split(" ")[0]
        return f"sdpa ({B},{H},{L},{E})" + {"dense": "", "causal": " causal",
                                           "padding": " padding mask"}[kind] + half

    @property
    def flops(self):
        """Floating-point operations per call (None for softmax: rated in ns per element)."""
        if self.group == "softmax":
            return None
        if self.group == "matmul":
            return 2.0 * self.shape[0] ** 3
        return sdpa_flops(*self.shape, causal=self.kind == "causal")

    @property
    def elements(self):
        return math.prod(self.shape) if self.group == "softmax" else None

    @property
    def kv_bytes(self):
        """Bytes of K and V (attention groups), each read once by an ideal kernel."""
        if not self.attention:
            return None
        B, H, L, S, E = self.shape
        return 2 * B * H * S * E * self.itemsize

    @property
    def out_bytes(self):
        """Bytes of the result."""
        if self.group == "softmax":
            return math.prod(self.shape) * 4
        if self.group == "matmul":
            return self.shape[0] ** 2 * 4
        B, H, L, S, E = self.shape
        return B * H * L * E * self.itemsize

    @property
    def seq_len(self):
        return self.shape[2] if self.attention else None


def half_formats():
    """The half formats this environment can build arrays of (bfloat16 needs ml_dtypes)."""
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        return ("float16",)
    return HALF_DTYPES


def build_specs(groups=FULL_GROUPS, quick=False):
    """The cases of the full harness (``quick``: a subset), in report order."""
    specs = []
    halves = () if quick else half_formats()
    if "softmax" in groups:
        for L in (QUICK_SELECTION["softmax"] if quick else SOFTMAX_L):
            specs += [Spec("softmax", (8, 128, L)), Spec("softmax", (8, 128, L), "mask")]
    if "matmul" in groups:
        specs += [Spec("matmul", (n,)) for n in (QUICK_SELECTION["matmul"] if quick else MATMUL_N)]
    if "sdpa" in groups:
        for B, H, T in (QUICK_SELECTION["sdpa"] if quick else SDPA_BHT):
            specs += [Spec("sdpa", (B, H, T, T, HEAD_DIM), kind) for kind in SDPA_KINDS]
        specs += [Spec("sdpa", (1, 8, T, T, HEAD_DIM), f"dense {h}")
                  for h in halves for T in HALF_SDPA_T]
    if "decode" in groups:
        specs.append(Spec("decode", DECODE_SHAPE, "dense"))
        specs += [Spec("decode", DECODE_SHAPE, f"dense {h}") for h in halves]
        if not quick:
            specs.append(Spec("decode", DECODE_SHORT_SHAPE, "dense"))
    if "tiny" in groups:
        specs.append(Spec("tiny", TINY_SHAPE, "dense"))
    return specs


def select_specs(specs, only):
    """The specs whose name contains one of the strings ``only`` (a string or a list; case
    insensitive); all of them if ``only`` is empty."""
    if not only:
        return list(specs)
    words = [only.lower()] if isinstance(only, str) else [w.lower() for w in only]
    return [s for s in specs if any(w in s.name.lower() for w in words)]


# ------------------------------------------------------------------------------------------
# Optional PyTorch
# ------------------------------------------------------------------------------------------

_torch_cache = []


def torch_module():
    """The torch module if it is installed (imported once), else None."""
    if not _torch_cache:
        try:
            import torch
        except ImportError:
            torch = None
        _torch_cache.append(torch)
    return _torch_cache[0]


# ------------------------------------------------------------------------------------------
# Case inputs and implementations
# ------------------------------------------------------------------------------------------


def prepare(spec, impls=IMPLS, seed=0):
    """Allocate the inputs of ``spec`` and return ``(make, reference)``.

    ``make(n_threads)`` -> dict impl -> zero-argument callable (the timed call);
    ``reference()`` -> dict impl -> zero-argument callable returning a result to compare
    (differs from the timed call for matmul, whose timed call accumulates in place, and for the
    peers that return their result in another layout). Peers in ``impls`` that are not
    installed are left out; a peer whose call cannot be built gets a callable that raises the
    error (reported by :func:`check_case`). Inputs are random (seeded by ``seed`` and the case
    name), float32.
    """
    from . import peers
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    torch = torch_module() if "torch" in impls else None
    available = {"torch": lambda: torch is not None, "ort": lambda: peers.ort_module() is not None,
                 "jax": lambda: peers.jax_module() is not None}
    impls = tuple(i for i in impls if i not in available or available[i]())
    builder = {"softmax": _prepare_softmax, "matmul": _prepare_matmul}.get(spec.group,
                                                                          _prepare_attention)
    make, reference = builder(spec, impls, rng, torch)
    return make, reference


def _keep(d, impls):
    return {k: f for k, f in d.items() if k in impls}


def _add_peers(timed, results, impls, builders):
    """Add the (call, result) pairs of ``builders`` (peer -> zero-argument builder) that are in
    ``impls`` to the dicts ``timed`` and ``results`` (either may be None); a builder that raises
    gives callables that raise its error."""
    for name, build in builders.items():
        if name not in impls:
            continue
        try:
            call, result = build()
        except Exception as exc:  # reported by check_case, never timed
            def call(exc=exc):
                raise exc
            result = call
        if timed is not None:
            timed[name] = call
        if results is not None:
            results[name] = result


def _prepare_softmax(spec, impls, rng, torch):
    import cyattn

    from . import peers
    x = rng.standard_normal(spec.shape, dtype=np.float32)
    mask = None
    if spec.kind == "mask":
        mask = rng.random(x.shape) < 0.8
        mask[..., 0] = True                      # no fully masked row (NumPy would give NaN)
    xt = torch.from_numpy(x) if torch is not None else None
    mt = torch.from_numpy(mask) if torch is not None and mask is not None else None

    # cyattn writes into a preallocated out= (rows in cache, the measure): a fresh
    # 4 MiB NumPy result costs ~1000 page faults per call, more than the softmax itself, while
    # torch's caching allocator hands back the same block. ONNX Runtime writes into a
    # preallocated output too (IOBinding). NumPy's reference allocates.
    out = np.empty_like(x)

    def own():
        d = {"cyattn": lambda: cyattn.softmax(x, mask=mask, out=out)}
        if mask is not None:
            d["numpy"] = lambda: np_masked_softmax(x, mask)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt.masked_fill(~mt, -math.inf), -1)
        else:
            d["numpy"] = lambda: np_softmax(x)
            if torch is not None:
                d["torch"] = lambda: torch.softmax(xt, -1)
        return d

    def builders(n_threads):
        return {"ort": lambda: peers.ort_softmax(x, mask, n_threads),
                "jax": lambda: peers.jax_softmax(x, mask)}

    def make(n_threads):
        d = own()
        _add_peers(d, None, impls, builders(n_threads))
        return _keep(d, impls)

    def reference():
        d = own()
        _add_peers(None, d, impls, builders(1))
        return _keep(d, impls)
    return make, reference


def _prepare_matmul(spec, impls, rng, torch):
    import cyattn

    from . import peers
    n = spec.shape[0]
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    oc, on = np.zeros((n, n), np.float32), np.zeros((n, n), np.float32)
    if torch is not None:
        at, bt, ot = torch.from_numpy(a), torch.from_numpy(b), torch.zeros((n, n))

    def builders(n_threads):
        # c stays zeros: the peers return c + a @ b in a new (or their own) array
        zeros = np.zeros((n, n), np.float32)
        return {"ort": lambda: peers.ort_matmul_accumulate(a, b, zeros, n_threads),
                "jax": lambda: peers.jax_matmul_accumulate(a, b, zeros)}

    def make(n_threads):
        d = {"cyattn": lambda: cyattn.matmul_accumulate(a, b, oc, n_threads=n_threads),
             "numpy": lambda: on.__iadd__(a @ b)}
        if torch is not None:
            d["torch"] = lambda: ot.add_(torch.matmul(at, bt))
        _add_peers(d, None, impls, builders(n_threads))
        return _keep(d, impls)

    def reference():
        d = {"cyattn": lambda: cyattn.matmul_accumulate(a, b, np.zeros((n, n), np.float32)),
             "numpy": lambda: a @ b}
        if torch is not None:
            d["torch"] = lambda: torch.matmul(at, bt)
        _add_peers(None, d, impls, builders(1))
        return _keep(d, impls)
    return make, reference


def padding_keep(B, S):
    """Key padding mask (B, 1, 1, S), True = take part: even batch entries keep the first
    3/4 of the keys, odd ones the first 7/8."""
    keep = np.ones((B, 1, 1, S), dtype=bool)
    for b in range(B):
        keep[b, ..., S - (S // 4 if b % 2 == 0 else S // 8):] = False
    return keep


def _prepare_attention(spec, impls, rng, torch):
    import cyattn

    from . import peers
    B, H, L, S, E = spec.shape
    q = rng.standard_normal((B, H, L, E), dtype=np.float32)
    k = rng.standard_normal((B, H, S, E), dtype=np.float32)
    v = rng.standard_normal((B, H, S, E), dtype=np.float32)
    if spec.storage != "float32":
        return _prepare_half_attention(spec, impls, torch, q, k, v)
    scale = 1.0 / math.sqrt(E)
    causal = spec.kind == "causal"
    keep = padding_keep(B, S) if spec.kind == "padding" else None
    add = None
    if "numpy" in impls:
        if causal:
            add = np.triu(np.full((L, S), -np.inf, np.float32), 1)
        elif keep is not None:
            add = np.where(keep, np.float32(0), np.float32(-np.inf)).astype(np.float32)
    if torch is not None:
        import torch.nn.functional as F
        qt, kt, vt = (torch.from_numpy(t) for t in (q, k, v))
        mt = torch.from_numpy(keep) if keep is not None else None

    def own(n_threads):
        d = {"cyattn": lambda: cyattn.scaled_dot_product_attention(
                 q, k, v, attn_mask=keep, is_causal=causal, n_threads=n_threads),
             "numpy": lambda: np_attention(q, k, v, scale, add)}
        if torch is not None:
            d["torch"] = lambda: F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mt,
                                                                 is_causal=causal)
        return d

    def builders(n_threads):
        return {"ort": lambda: peers.ort_attention(q, k, v, keep, causal, scale, n_threads),
                "jax": lambda: peers.jax_attention(q, k, v, keep, causal, scale)}

    def make(n_threads):
        d = own(n_threads)
        _add_peers(d, None, impls, builders(n_threads))
        if spec.group == "decode" and KV_READ in impls:
            d[KV_READ] = read_once([k, v], n_threads or 1)
        return _keep(d, impls)

    def reference():
        d = own(None)
        _add_peers(None, d, impls, builders(1))
        return _keep(d, impls)
    return make, reference


def _half_dtype(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _prepare_half_attention(spec, impls, torch, q, k, v):
    """A dense attention case on half-precision inputs: cyattn and PyTorch (NumPy has no
    bfloat16 and its float16 matmul is not vectorised, ONNX Runtime and JAX are not set up
    for these cases); decode also times reading the half-size K+V once."""
    import cyattn
    dtype = _half_dtype(spec.storage)
    q, k, v = (t.astype(dtype) for t in (q, k, v))
    if torch is not None:
        import torch.nn.functional as F
        tdtype = getattr(torch, spec.storage)
        qt, kt, vt = (torch.from_numpy(t.view(np.int16)).view(tdtype) for t in (q, k, v))

    def own(n_threads, as_float32):
        def cy():
            out = cyattn.scaled_dot_product_attention(q, k, v, n_threads=n_threads)
            return out.astype(np.float32) if as_float32 else out
        d = {"cyattn": cy}
        if torch is not None:
            def tc():
                out = F.scaled_dot_product_attention(qt, kt, vt)
                return out.float().numpy() if as_float32 else out
            d["torch"] = tc
        return d

    def make(n_threads):
        d = own(n_threads, False)
        if spec.group == "decode" and KV_READ in impls:
            d[KV_READ] = read_once([k, v], n_threads or 1)
        return _keep(d, impls)

    def reference():
        return _keep(own(None, True), impls)
    reference.tolerance = (CHECK_HALF_RTOL, CHECK_HALF_ATOL)
    return make, reference


def check_case(reference, details=None):
    """Run each reference call once: (names whose result differs from cyattn's, dict name ->
    error message for those that raised). ``details``, a dict, receives name -> what differs
    for each differing result (shape, or the largest difference and the tolerances).
    ``reference.tolerance`` (rtol, atol), when set, replaces the float32 tolerances."""
    rtol, atol = getattr(reference, "tolerance", (CHECK_RTOL, CHECK_ATOL))
    results, errors = {}, {}
    for name, fn in reference().items():
        try:
            results[name] = np.asarray(fn())
        except Exception as exc:  # a failing implementation is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"
    ref = results.get("cyattn")
    differs = []
    for name, r in ([] if ref is None else results.items()):
        if name == "cyattn":
            continue
        if r.shape != ref.shape:
            why = f"result of shape {r.shape}, cyattn's is {ref.shape}"
        elif not np.allclose(r, ref, rtol=rtol, atol=atol):
            with np.errstate(invalid="ignore"):
                d = np.abs(r.astype(np.float64) - ref)
            d = d[~np.isnan(d)]
            diff = float(d.max()) if d.size else float("nan")
            nans = int(np.isnan(r).sum()) - int(np.isnan(ref).sum())
            why = (f"max |difference from cyattn| {diff:.3g} (rtol {rtol:g}, atol "
                   f"{atol:g})" + (f", {nans} more NaN" if nans else ""))
        else:
            continue
        differs.append(name)
        if details is not None:
            details[name] = why
    return differs, errors
