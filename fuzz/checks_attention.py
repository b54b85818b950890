"""scaled_dot_product_attention cases of the fuzz harness: ``build_sdpa`` decodes one call
(batch broadcasting, GQA, masks, causal alignment, scale, lse, ``out=``, long rows, faults) and
attaches its check against the oracle or NumPy float64.
"""
import fractions
import math

import numpy as np

import cyattn
from checks_common import (_NO_OUT, CT, FLAG_TYPE, FLOATS, INF, NAN, VALUE_SPECIALS, bits,
                           build_array, build_mask, check_no_alias, compare, fail, gen_float_mask,
                           grid, make_out, pick_bad_dtype, pick_float, pick_in_layout, pick_threads,
                           reduce_shape, ref_copy)

SCALES = (None, None, 1.0, 0.5, 0.25, 0.0, -0.5, 2.0, 0.125, -0.0, -1.0, 8.0, 2,
          np.float32(0.5), np.float16(0.25), fractions.Fraction(1, 3), INF, NAN, -INF, 1e-30)
SCALE_TYPE = ("1.0", True, 1j, [1.0], np.bool_(False))
BAD_ALIGN = ("bottom-right", "TOP_LEFT", None, "", 1)


def sdpa_row_flags(q, k, v, mask, is_causal, scale, align, gqa, compute):
    """Per (batch..., L) row: (loose, skip_out).

    loose: the largest permitted score is a huge finite value (a -1e9-style mask shifts the
    whole row), so the compute dtype rounds the scores and only the NaN / inf pattern is
    checked. skip_out: a permitted key whose weight underflows to 0 in the compute dtype but
    not in float64 has an inf/NaN value; whether it is read is decided by that rounding."""
    with np.errstate(all="ignore"):
        q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
        k, v = CT.expand_kv_heads(q, k, v, gqa)
        batch = CT.sdpa_batch_shape(q, k, v)
        L, E = q.shape[-2:]
        S = k.shape[-2]
        q = np.broadcast_to(q, batch + q.shape[-2:])
        k = np.broadcast_to(k, batch + k.shape[-2:])
        v = np.broadcast_to(v, batch + v.shape[-2:])
        sc = (1.0 / math.sqrt(E) if E else 1.0) if scale is None else float(scale)
        s = sc * np.matmul(q, np.swapaxes(k, -1, -2)) if E else np.full(batch + (L, S), sc * 0.0)
        keep = np.ones((L, S), dtype=bool)
        if is_causal:
            off = 0 if align == "top_left" else S - L
            keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
        keep = np.broadcast_to(keep, batch + (L, S))
        if mask is not None and mask.dtype == np.bool_:
            keep = keep & np.broadcast_to(mask, batch + (L, S))
        elif mask is not None:
            s = s + CT._mask_for_oracle(mask, compute).astype(np.float64)
        pf = keep & np.isfinite(s)
        sf = np.where(pf, s, -np.inf)
        rmax = sf.max(axis=-1) if S else np.full(batch + (L,), -np.inf)
        loose = np.isfinite(rmax) & (np.abs(rmax) > 1e4)
        thresh = 95.0 if compute != np.float64 else 740.0
        far = pf & ((rmax[..., None] - sf) > thresh)
        vbad = ~np.isfinite(v).all(axis=-1) if v.shape[-1] else np.zeros(batch + (S,), bool)
        skip = (far & vbad[..., None, :]).any(axis=-1) if S else np.zeros(batch + (L,), bool)
    return loose, skip


def build_sdpa(r, case):
    big = r.chance(1, 40)
    # plain: the everyday call (no mask, GQA or out; one float32/float64 dtype; equal batch
    # shapes; C-contiguous arrays; plain options), which cyattn may serve on a fast path
    plain = r.chance(1, 4)
    dts = [pick_float(r)] * 3
    if r.chance(1, 5):
        dts = [pick_float(r) for _ in range(3)]
    if plain:
        dts = [r.pick((np.dtype(np.float32), np.dtype(np.float64)))] * 3
        case.notes.append("plain call")
    gqa = r.chance(1, 4) and not plain
    outer = tuple(0 if r.chance(1, 16) else r.pick((1, 2, 3)) for _ in range(r.int(0, 2)))
    if gqa:
        hkv = r.pick((1, 2))
        hq = hkv * r.pick((1, 2, 3))
        kv_outer = reduce_shape(r, outer)
        qb, kb, vb = outer + (hq,), kv_outer + (hkv,), kv_outer + (hkv,)
    else:
        qfull = outer + ((r.pick((1, 2, 3)),) if r.bool() else ())
        kb, vb = reduce_shape(r, qfull), reduce_shape(r, qfull)
        qb = reduce_shape(r, qfull) if r.chance(1, 3) else qfull
        if plain:
            qb = kb = vb = qfull
    L = r.pick((1, 2, 3, 4, 5, 0, 8, 9, 65, 17, 64))
    S = r.pick((1, 2, 3, 4, 5, 0, 7, 9, 16, 25, 33, 48))
    E = r.pick((1, 2, 3, 4, 8, 0, 16, 17, 33))
    Ev = r.pick((1, 2, 3, 5, 0, 17, 24, 25))
    long = not big and r.chance(1, 8)
    if long:
        # the fused kernel's regimes: several 256-key blocks (online rescaling, block
        # skipping) and, with L <= 4 and S >= 1024, the decode path's 512-key chunks
        L = r.pick((1, 2, 3, 4, 5, 8, 65))
        S = r.pick((257, 300, 512, 513, 767, 1024, 1025, 1100, 1537, 2050))
        E, Ev = r.pick((1, 2, 3, 4, 8)), r.pick((1, 2, 3, 5, 8))
        if gqa:
            qb, kb, vb = (2,), (1,), (1,)
        else:
            qb = r.pick(((), (1,), (2,)))
            kb = vb = qb if plain or r.bool() else ()
        case.notes.append("long rows")
    if big:
        qb, kb, vb = ((2, 2),) * 3 if plain else ((2, 2), (2, 1), (2, 1))
        L, S, E, Ev = (130, 600, 16, 16) if r.bool() else (2, 4096, 16, 16)
        gqa = False
    batch = CT.sdpa_batch_shape(np.empty(qb + (1, 1)), np.empty(kb + (1, 1)),
                                np.empty(vb + (1, 1)), gqa)
    if long:
        while math.prod(batch) * L * S * (E + Ev + 1) > 40000:
            if L > 1:
                L //= 2
            elif E + Ev > 2:
                E, Ev = max(E // 2, 1), max(Ev // 2, 1)
            else:
                S = max(S // 2, 257)
    while not big and not long and math.prod(batch) * L * max(S, 1) * (E + Ev + 1) > 12000:
        L, S = max(L // 2, 1), max(S // 2, 1)
    rng = np.random.default_rng(int.from_bytes(r.take(4), "little"))
    if big or long:
        # too many values for the input bytes: a generator seeded by them, plus a few
        # specials at chosen positions
        q = rng.integers(-128, 128, qb + (L, E)) / 64
        k = rng.integers(-128, 128, kb + (S, E)) / 64
        v = rng.integers(-128, 128, vb + (S, Ev)) / 32
        for _ in range(0 if big else r.pick((0, 1, 2, 3))):
            arr = r.pick((q, k, v))
            if arr.size:
                arr.reshape(-1)[r.int(0, arr.size - 1)] = r.pick(VALUE_SPECIALS)
    else:
        specials = r.pick((0, 1, 0, 2))
        q = grid(r, qb + (L, E), 1 / 64, specials)
        k = grid(r, kb + (S, E), 1 / 64, specials)
        v = grid(r, vb + (S, Ev), 1 / 32, specials)
    if not big and r.chance(1, 8) and dts[2] in FLOATS:
        # huge finite values: a weighted sum of them must not overflow (non-negative, so
        # that no cancellation makes the reference comparison ill-conditioned)
        v = np.abs(v) * float(np.finfo(dts[2]).max / 8)
        case.notes.append("huge values")
    compute = CT.compute_dtype(*dts)

    mask_kind = r.pick(("none", "bool", "float", "bool"))
    if plain:
        mask_kind = "none"
    mask = mdt = None
    if mask_kind != "none":
        mshape = reduce_shape(r, batch + (L, S))
        if mask_kind == "bool":
            density = r.pick((0.5, 0.875, 0.125, 1.0))
            if long:
                mask = rng.random(mshape) < density
            else:
                mask = bits(r, mshape, density)
            mdt = np.dtype(np.bool_)
            if r.chance(1, 2) and mask.ndim >= 2 and mask.size:
                idx = tuple(r.int(0, s - 1) for s in mask.shape[:-1])
                mask[idx] = False            # a fully masked row
        else:
            mask, mdt = gen_float_mask(r, mshape, compute)
            if long or big:
                mask = np.where(mask == 0, rng.integers(-128, 128, mshape) / 32, mask)
            if big:     # the NumPy reference of big cases knows -inf and finite values only
                mask = np.where(np.isnan(mask) | (np.isinf(mask) & (mask > 0)), 0.0, mask)
                mask = np.where(np.abs(mask) > 1e4, -np.inf, mask)
        if (long or big) and mask.ndim and mask.shape[-1] > 1 and r.bool():
            # a run of removed keys: whole key blocks can be skipped
            start = r.int(0, mask.shape[-1] - 1)
            stop = start + r.pick((256, 512, 1, 100, S, 255, 257))
            mask[..., start:stop] = False if mask.dtype == np.bool_ else -np.inf
    is_causal = r.chance(1, 3)
    align = r.pick(("top_left", "bottom_right"))
    if is_causal or mask_kind == "bool":
        if r.chance(1, 2) and not big:
            # poison what no row may read: keys (k and v) and rows without any permitted key
            keep = np.ones((L, S), bool)
            if is_causal:
                off = 0 if align == "top_left" else S - L
                keep = np.arange(S)[None, :] <= np.arange(L)[:, None] + off
            full = np.broadcast_to(keep, batch + (L, S))
            if mask_kind == "bool":
                full = full & np.broadcast_to(mask, batch + (L, S))
            flat = full.reshape(math.prod(batch), L, S)
            unused = ~flat.any(axis=(0, 1))
            dead = ~flat.any(axis=(0, 2))
            k[..., unused, :] = r.pick((NAN, INF, -INF))
            v[..., unused, :] = r.pick((NAN, INF, -INF))
            q[..., dead, :] = r.pick((NAN, INF, -INF))
    scale = r.pick(SCALES)
    if big and scale is not None and not math.isfinite(float(scale)):
        scale = None
    return_lse = r.bool()

    # faults
    names = ["query", "key", "value"]
    arrays = [q, k, v]
    bad_flag = None
    if not big and not plain and r.chance(1, 6):
        which = r.int(0, 13)
        if which == 0:
            i = r.int(0, 2)
            dts[i] = pick_bad_dtype(r, case, names[i])
        elif which == 1:
            i = r.int(0, 2)
            arrays[i] = arrays[i].reshape(-1)[:3]
            case.fault(f"{names[i]} 1-D", ValueError, names[i])
        elif which == 2:
            arrays[1] = grid(r, kb + (S, E + 1), 1 / 64)
            case.fault("E mismatch", ValueError, "key", "query")
        elif which == 3:
            arrays[2] = grid(r, vb + (S + 1, Ev), 1 / 32)
            case.fault("S mismatch", ValueError, "value", "key")
        elif which == 4:
            arrays[0] = np.zeros((2, 1, L, E))
            arrays[1] = np.zeros((3, 1, S, E))
            case.fault("batch mismatch", ValueError, "query", "batch")
        elif which == 5:
            gqa = True
            hq, hk = r.pick(((3, 2), (2, 3), (4, 3), (1, 0)))
            hv = hk if r.bool() else hk + 1
            arrays = [np.zeros((hq, L, E)), np.zeros((hk, S, E)), np.zeros((hv, S, Ev))]
            case.fault("gqa heads", ValueError, "enable_gqa", "heads")
        elif which == 6:
            gqa = True
            arrays = [np.zeros(a.shape[-2:]) for a in arrays]
            case.fault("gqa without head dim", ValueError, "enable_gqa")
        elif which == 7:
            mask = np.zeros(batch + (L, S)) if mask is None else mask
            mdt = r.pick((np.dtype(np.int64), np.dtype(np.int8), np.dtype(np.complex128)))
            case.fault(f"attn_mask dtype {mdt}", TypeError, "attn_mask")
        elif which == 8:
            mask = np.ones((2,) + batch + (L, S), bool)
            mdt = np.dtype(np.bool_)
            case.fault("attn_mask enlarges", ValueError, "attn_mask")
        elif which == 9:
            scale = r.pick(SCALE_TYPE)
            case.fault(f"scale={scale!r}", TypeError, "scale")
        elif which == 10:
            scale = 10**400
            case.fault("scale=10**400", ValueError, "scale")
        elif which == 11:
            bad_flag = r.pick(("is_causal", "enable_gqa", "return_lse"))
            case.fault(f"{bad_flag} not bool", TypeError, bad_flag)
        elif which == 12:
            align = r.pick(BAD_ALIGN)
            case.fault(f"causal_alignment={align!r}", ValueError, "causal_alignment")
        else:
            mask = np.ones(batch + (L, S + 2), bool)      # never broadcasts (also S = 0)
            mdt = np.dtype(np.bool_)
            case.fault("attn_mask shape", ValueError, "attn_mask")
    q, k, v = arrays

    args = []
    for a, dt in zip(arrays, dts):
        lay, ro = pick_in_layout(r, allow_bcast=not big)
        if big:
            lay = "C" if lay == "list" else lay
        if plain:
            lay = "C"
        args.append(build_array(r, case.mem, a, dt, lay, ro, slack=r.pick((0, 64, 256))))
    mask_arg = None
    if mask is not None:
        ml, mro = pick_in_layout(r)
        mask_arg = build_mask(r, case.mem, mask, mdt, ml, mro)
    refs = [ref_copy(a) for a in args]
    mask_ref = ref_copy(mask_arg)
    try:
        result_dtype = np.result_type(*refs) if all(a.dtype in FLOATS for a in refs) else None
    except TypeError:
        result_dtype = None
    if result_dtype is not None:
        result_dtype = np.dtype(result_dtype)
    flags = {"is_causal": is_causal, "enable_gqa": gqa, "return_lse": return_lse}
    if bad_flag:
        flags[bad_flag] = r.pick(FLAG_TYPE)
    kwargs = {}
    pos = list(args)
    if r.chance(1, 3):          # attn_mask, is_causal, scale positionally
        pos += [mask_arg, flags["is_causal"], scale]
    else:                       # by keyword, defaults sometimes left out
        for name, val, default in (("attn_mask", mask_arg, None),
                                   ("is_causal", flags["is_causal"], False),
                                   ("scale", scale, None)):
            if val is not default or r.bool():
                kwargs[name] = val
    if is_causal or align != "top_left" or r.bool():
        kwargs["causal_alignment"] = align
    for name in ("enable_gqa", "return_lse"):
        if flags[name] is not False or r.bool():
            kwargs[name] = flags[name]
    out_shape = batch + (L, v.shape[-1] if v.ndim else 0)
    out = _NO_OUT if plain else make_out(r, case, out_shape, result_dtype,
                                         inputs=list(zip(names, args)) + [("attn_mask", mask_arg)],
                                         overlap=not big)
    if out is not _NO_OUT:
        kwargs["out"] = out
        case.out = out
    if plain:
        kwargs.pop("enable_gqa", None)
    pick_threads(r, case, kwargs, big, plain)
    case.fn = cyattn.scaled_dot_product_attention
    case.args = pos
    case.kwargs = kwargs
    ev = out_shape[-1]

    def verify(result):
        if return_lse:
            if not (isinstance(result, tuple) and len(result) == 2):
                fail(case, f"return_lse=True returned {type(result).__name__}")
            res, lse = result
        else:
            res, lse = result, None
        if case.out is not None and res is not case.out:
            fail(case, "with out=, the output is not out")
        for what, arr, shp in (("output", res, out_shape), ("lse", lse, out_shape[:-1])):
            if arr is None:
                continue
            if not isinstance(arr, np.ndarray) or arr.shape != shp or arr.dtype != result_dtype:
                fail(case, f"{what}: {type(arr).__name__} {getattr(arr, 'shape', None)} "
                           f"{getattr(arr, 'dtype', None)}; expected {shp} {result_dtype}")
            if case.out is None or what == "lse":
                check_no_alias(case, arr, list(zip(names, args)) + [("attn_mask", mask_arg)])
        sc = None if scale is None else float(scale)
        kk = E + S

        def numpy_reference():
            # (out, lse) in NumPy float64; it knows -inf and finite masks
            return CT.numpy_sdpa(refs[0], refs[1], refs[2],
                                 None if mask_ref is None else (
                                     mask_ref if mask_ref.dtype == np.bool_
                                     else CT._mask_for_oracle(mask_ref, compute)),
                                 is_causal, sc, align, gqa)

        if big:
            ref_out, ref_lse = numpy_reference()
            compare(case, "output", res, ref_out, result_dtype, kk)
            if lse is not None:
                compare(case, "lse", lse, ref_lse, result_dtype, kk)
            kw1 = dict(kwargs, n_threads=1)
            kw1.pop("out", None)
            one = case.fn(*pos, **kw1)
            one_out = one[0] if return_lse else one
            if not np.array_equal(np.asarray(one_out).view(np.uint8),
                                  np.ascontiguousarray(res).view(np.uint8)):
                fail(case, "output with n_threads=1 differs bitwise")
            return
        finite = (all(np.isfinite(x).all() for x in refs) and (sc is None or math.isfinite(sc))
                  and (mask_ref is None or mask_ref.dtype == np.bool_
                       or not (np.isnan(mask_ref).any() or np.isposinf(mask_ref).any())))
        if long and finite:
            # long rows without NaN/+inf: the NumPy float64 reference (the oracle's pure-Python
            # loops would dominate the run time)
            ref_out, ref_lse = numpy_reference()
        else:
            ref_out, ref_lse = CT.oracle_sdpa(refs[0], refs[1], refs[2], mask_ref, is_causal,
                                              sc, align, enable_gqa=gqa)
        loose, skip = sdpa_row_flags(refs[0], refs[1], refs[2], mask_ref, is_causal, sc, align,
                                     gqa, compute)
        compare(case, "output", res, ref_out, result_dtype, kk,
                skip=np.broadcast_to(skip[..., None], out_shape),
                loose=np.broadcast_to((loose & ~skip)[..., None], out_shape))
        if lse is not None:
            compare(case, "lse", lse, ref_lse, result_dtype, kk, loose=loose)
        dead = np.isneginf(ref_lse) & ~skip
        if ev and not np.all(np.asarray(res)[dead] == 0):
            fail(case, "a fully masked row is not exactly 0")
        if lse is not None and not np.all(np.isneginf(lse[dead])):
            fail(case, "a fully masked row has lse != -inf")

    case.verify = verify
    return case
