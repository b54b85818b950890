"""Fuzz cases of ``scaled_dot_product_attention``'s attention variants (issue 24): ``window``,
``softcap``, ``sinks``, ``alibi_slopes``, ``key_lengths`` and ``query_lengths``, with shapes,
GQA, broadcasting, masks, causal alignment, memory layouts, ``out=`` and ``n_threads``.

Hooked into ``api_checks.build_case``: an input whose LAST byte is :data:`TAG` (not consumed;
the decoder reads the input from the front as usual) and that selects
``scaled_dot_product_attention`` decodes here instead of ``api_checks.build_sdpa``, once cyattn
has the variant arguments (:data:`HAS_VARIANTS`). Selecting by the last byte leaves every other
input's meaning, and so the seed corpus, unchanged.

The checks are ``api_checks.check_one``'s (documented errors only, naming the argument; buffers
untouched on failure; shapes, dtypes, no warnings); the values are compared with
``cyattn.oracle`` (small cases, NaN/inf included) or the NumPy float64 construction of
``tests/conftest.py`` (long rows, finite values), within the tolerances of conftest.py; long
cases must be bit-identical to an ``n_threads=1`` call. Faults: a negative or non-int window
side, a softcap <= 0 / NaN / of the wrong type, negative or non-integer (float, bool) lengths,
and per-batch arguments of the wrong shape or dtype.
"""
import inspect

import numpy as np

import cyattn

TAG = 0xA5
HAS_VARIANTS = "window" in inspect.signature(cyattn.scaled_dot_product_attention).parameters
NAN, INF = float("nan"), float("inf")
PER_BATCH_LAYOUTS = ("C", "F", "rev", "step", "unaligned", "neg1", "bcast")


def selected(r):
    """True if the input asks for a variants case (its last byte is TAG)."""
    return HAS_VARIANTS and len(r.data) >= 2 and r.data[-1] == TAG


def _per_batch_array(r, A, case, values, dtype):
    lay = r.pick(PER_BATCH_LAYOUTS) if r.chance(1, 2) else "C"
    return A.build_array(r, case.mem, values, dtype, lay, read_only=r.chance(1, 5))


def build(r, case, A):
    """Decode one variants call into ``case`` (``A``: the api_checks module)."""
    CT = A.CT
    case.notes.append("attention variants")
    dts = [A.pick_float(r)] * 3
    if r.chance(1, 6):
        dts = [A.pick_float(r) for _ in range(3)]
    gqa = r.chance(1, 3)
    B = r.pick((1, 2))
    if gqa:
        hkv = r.pick((1, 2))
        hq = hkv * r.pick((1, 2, 3))
        qb, kb = (B, hq), (r.pick((B, 1)), hkv)
        vb = kb
    else:
        hq = r.pick((1, 2, 3))
        qb = (B, hq)
        kb, vb = A.reduce_shape(r, qb), A.reduce_shape(r, qb)
    batch = (B, hq)
    regime = r.pick(("small", "small", "long keys", "many rows"))
    if regime == "small":
        L, S = r.pick((1, 2, 3, 4, 5, 0, 7, 9)), r.pick((1, 2, 3, 5, 0, 7, 9, 16))
    elif regime == "long keys":      # several 256-key blocks; L <= 4 decodes in 512-key chunks
        L, S = r.pick((1, 2, 3, 4)), r.pick((257, 300, 513, 1100))
    else:                            # several query panels
        L, S = r.pick((65, 70)), r.pick((3, 9, 17))
    E, Ev = r.pick((1, 2, 3, 4, 8, 0)), r.pick((1, 2, 3, 5))
    case.notes.append(regime)
    small = regime == "small"
    rng = np.random.default_rng(int.from_bytes(r.take(4), "little"))
    if small:
        specials = r.pick((0, 0, 1))
        q = A.grid(r, qb + (L, E), 1 / 64, specials)
        k = A.grid(r, kb + (S, E), 1 / 64, specials)
        v = A.grid(r, vb + (S, Ev), 1 / 32, specials)
    else:
        q = rng.integers(-128, 128, qb + (L, E)) / 64
        k = rng.integers(-128, 128, kb + (S, E)) / 64
        v = rng.integers(-128, 128, vb + (S, Ev)) / 32
    compute = CT.compute_dtype(*[d for d in dts if d in A.FLOATS] or [np.float64])

    mask = mdt = None
    mask_kind = r.pick(("none", "bool", "float", "none"))
    if mask_kind != "none":
        mshape = A.reduce_shape(r, batch + (L, S))
        removed = rng.random(mshape) < r.pick((0.125, 0.5, 0.0))
        if mask_kind == "bool":
            mask, mdt = ~removed, np.dtype(np.bool_)
        else:
            mask = np.where(removed, -np.inf, rng.integers(-64, 64, mshape) / 32)
            mdt = r.pick((np.dtype(compute), np.dtype(np.float64), np.dtype(np.float32)))

    kwargs = {"is_causal": r.chance(1, 2),
              "causal_alignment": r.pick(("top_left", "bottom_right")),
              "enable_gqa": gqa, "return_lse": r.bool()}
    if r.chance(1, 4):
        kwargs["scale"] = r.pick((0.25, 1.0, -0.5, 0.0))
    variants = {}
    side_values = (0, 1, 2, 3, 5, 8, 64, 255, 256, 300)
    if r.chance(1, 2):
        variants["window"] = tuple(None if r.chance(1, 4) else r.pick(side_values)
                                   for _ in range(2))
    if r.chance(1, 3):
        variants["softcap"] = r.pick((0.5, 1.0, 2.5, 20.0, 50.0))
    if r.chance(1, 3):
        sv = (-INF, INF, NAN) if small else (-INF,)
        shape = A.reduce_shape(r, batch)
        variants["sinks"] = _per_batch_array(
            r, A, case, A.grid(r, shape, 1 / 16, r.pick((0, 1)), sv),
            r.pick((np.float64, np.float32)))
    if r.chance(1, 3):
        shape = A.reduce_shape(r, batch)
        slopes = 2.0 ** -rng.integers(0, 9, shape)
        variants["alibi_slopes"] = _per_batch_array(r, A, case, slopes,
                                                    r.pick((np.float64, np.float32)))
    for name, n in (("key_lengths", S), ("query_lengths", L)):
        if r.chance(1, 3):
            shape = A.reduce_shape(r, batch)
            lengths = rng.integers(0, n + 3, shape)
            variants[name] = _per_batch_array(r, A, case, lengths,
                                              r.pick((np.int64, np.int32)))

    if r.chance(1, 6):
        which = r.int(0, 9)
        if which == 0:
            variants["window"] = (r.pick((-1, -5)), 0)
            case.fault("window side < 0", ValueError, "window")
        elif which == 1:
            variants["window"] = (1, r.pick((1.5, "2", 2.0)))
            case.fault("window side not an int", TypeError, "window")
        elif which == 2:
            variants["softcap"] = r.pick((0.0, -1.0, NAN))
            case.fault(f"softcap={variants['softcap']}", ValueError, "softcap")
        elif which == 3:
            variants["softcap"] = r.pick(("1", 1j, [2.0]))
            case.fault(f"softcap={variants['softcap']!r}", TypeError, "softcap")
        elif which == 4:
            variants["key_lengths"] = np.full(batch, -1 - r.int(0, 3), np.int64)
            case.fault("negative key_lengths", ValueError, "key_lengths")
        elif which == 5:
            variants["query_lengths"] = np.full(batch[-1:], 1.0)
            case.fault("float query_lengths", TypeError, "query_lengths")
        elif which == 6:
            variants["sinks"] = np.zeros(batch[-1] + 1)
            case.fault("sinks shape", ValueError, "sinks")
        elif which == 7:
            variants["alibi_slopes"] = np.ones(batch[-1], dtype=bool)
            case.fault("bool alibi_slopes", TypeError, "alibi_slopes")
        elif which == 8:
            variants["key_lengths"] = np.ones(batch, dtype=bool)
            case.fault("bool key_lengths", TypeError, "key_lengths")
        else:
            variants["query_lengths"] = np.zeros((B + 1, 1), np.int64)
            case.fault("query_lengths shape", ValueError, "query_lengths")

    names = ["query", "key", "value"]
    args = []
    for a, dt in zip((q, k, v), dts):
        lay, ro = A.pick_in_layout(r)
        args.append(A.build_array(r, case.mem, a, dt, lay, ro))
    mask_arg = None
    if mask is not None:
        ml, mro = A.pick_in_layout(r)
        mask_arg = A.build_mask(r, case.mem, mask, mdt, ml, mro)
    refs = [A.ref_copy(a) for a in args]
    mask_ref = A.ref_copy(mask_arg)
    result_dtype = np.dtype(np.result_type(*refs)) if all(
        a.dtype in A.FLOATS for a in refs) else None
    out_shape = batch + (L, Ev)
    # long cases call again with n_threads=1 to compare bits, so out must not overlap an input
    out = A.make_out(r, case, out_shape, result_dtype,
                     inputs=list(zip(names, args)) + [("attn_mask", mask_arg)], overlap=small)
    kwargs.update(variants)
    if out is not A._NO_OUT:
        kwargs["out"] = out
        case.out = out
    A.pick_threads(r, case, kwargs)
    case.fn = cyattn.scaled_dot_product_attention
    case.args = args + [mask_arg]
    case.kwargs = kwargs
    return_lse = kwargs["return_lse"]

    def verify(result):
        res, lse = result if return_lse else (result, None)
        if case.out is not None and res is not case.out:
            A.fail(case, "with out=, the output is not out")
        for what, arr, shp in (("output", res, out_shape), ("lse", lse, out_shape[:-1])):
            if arr is None:
                continue
            if not isinstance(arr, np.ndarray) or arr.shape != shp or arr.dtype != result_dtype:
                A.fail(case, f"{what}: {type(arr).__name__} {getattr(arr, 'shape', None)} "
                             f"{getattr(arr, 'dtype', None)}; expected {shp} {result_dtype}")
        ref_mask = mask_ref
        if ref_mask is not None and ref_mask.dtype != np.bool_:
            ref_mask = CT._mask_for_oracle(ref_mask, compute)
        opts = {n: kwargs[n] for n in ("is_causal", "causal_alignment", "enable_gqa")}
        opts["scale"] = kwargs.get("scale")
        for n, x in variants.items():
            opts[n] = np.array(x) if isinstance(x, np.ndarray) else x
        if small:
            ref_out, ref_lse = CT.oracle_sdpa_variants(*refs, ref_mask, **opts)
        else:
            ref_out, ref_lse = CT.numpy_sdpa_variants(*refs, ref_mask, **opts)
        kk = E + S + 1
        A.compare(case, "output", res, ref_out, result_dtype, kk)
        if lse is not None:
            A.compare(case, "lse", lse, ref_lse, result_dtype, kk)
        if not small and kwargs.get("n_threads") != 1:
            kw1 = dict(kwargs, n_threads=1)
            kw1.pop("out", None)
            one = case.fn(*case.args, **kw1)
            one_out = one[0] if return_lse else one
            if not np.array_equal(np.asarray(one_out).view(np.uint8),
                                  np.ascontiguousarray(res).view(np.uint8)):
                A.fail(case, "output with n_threads=1 differs bitwise")

    case.verify = verify
    return case
