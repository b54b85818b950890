"""multi_head_attention cases of the fuzz harness: ``build_mha`` decodes one call of the function
or of ``MultiHeadAttention`` (packed or separate projections, biases, masks, flags, faults) and
attaches its check against the oracle.
"""
import numpy as np

import cyattn
from cyattn import oracle
from checks_common import (CT, FLAG_TYPE, FLOATS, INF, NAN, RAGGED, bits, build_array, build_mask,
                           compare, fail, grid, pick_bad_dtype, pick_float, pick_in_layout,
                           ref_copy)

MHA_FLAGS = ("need_weights", "average_attn_weights", "is_causal", "batch_first")


def _mha_via_class(E, H, kdim, vdim, bias, batch_first, dtype, pargs):
    def call(query, key, value, **kwargs):
        module = cyattn.MultiHeadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim,
                                           batch_first=batch_first, dtype=dtype, seed=0)
        state = {}
        if kdim == E and vdim == E:
            state["in_proj_weight"] = pargs.get("in_proj_weight")
            if state["in_proj_weight"] is None:
                state["in_proj_weight"] = np.concatenate(
                    [np.asarray(pargs[n]) for n in ("q_proj_weight", "k_proj_weight",
                                                   "v_proj_weight")])
        else:
            for n in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                state[n] = pargs[n]
        state["out_proj.weight"] = pargs["out_proj_weight"]
        if bias:
            state["in_proj_bias"] = pargs["in_proj_bias"]
            state["out_proj.bias"] = pargs["out_proj_bias"]
        module.load_state_dict(state)
        return module(query, key, value, **kwargs)
    call.__name__ = "MultiHeadAttention.forward"
    return call


def gen_mha_mask(r, shape):
    kind = r.pick(("none", "bool", "float", "bool"))
    if kind == "none":
        return None, None
    if kind == "bool":
        return bits(r, shape, r.pick((0.5, 0.125, 0.875, 0.0))), np.dtype(np.bool_)
    mdt = r.pick((np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.float16)))
    return grid(r, shape, 1 / 64, r.pick((1, 2, 0)), (-INF, -INF, NAN, INF)), mdt


def build_mha(r, case):
    batched = not r.chance(1, 4)
    N = r.pick((1, 2, 3))
    L = r.pick((1, 2, 3, 0, 4, 5))
    S = r.pick((1, 2, 3, 0, 4))
    H = r.pick((1, 2, 4))
    E = H * r.pick((1, 2))
    separate = r.chance(1, 3)
    kdim = r.pick((E, 1, 2, 3)) if separate else E
    vdim = r.pick((E, 1, 3)) if separate else E
    flags = {"need_weights": r.bool(), "average_attn_weights": r.bool(),
             "is_causal": r.chance(1, 3), "batch_first": r.bool()}
    dt = pick_float(r)
    pdt = dt if not r.chance(1, 5) else pick_float(r)
    specials = r.pick((0, 1, 0, 2))
    q = grid(r, (N, L, E), 1 / 64, specials)
    k = grid(r, (N, S, kdim), 1 / 64, specials)
    v = grid(r, (N, S, vdim), 1 / 64, specials)
    params = {}
    if separate:
        params["q_proj_weight"] = grid(r, (E, E), 1 / 1024)
        params["k_proj_weight"] = grid(r, (E, kdim), 1 / 1024)
        params["v_proj_weight"] = grid(r, (E, vdim), 1 / 1024)
    else:
        params["in_proj_weight"] = grid(r, (3 * E, E), 1 / 1024)
    if r.bool():
        params["in_proj_bias"] = grid(r, (3 * E,), 1 / 1024)
    params["out_proj_weight"] = grid(r, (E, E), 1 / 1024)
    if r.bool():
        params["out_proj_bias"] = grid(r, (E,), 1 / 1024)
    kpm, kpm_dt = gen_mha_mask(r, (N, S))
    am3 = r.chance(1, 3)
    am, am_dt = gen_mha_mask(r, (N * H, L, S) if am3 else (L, S))
    if kpm is not None and kpm_dt == np.bool_ and r.chance(1, 2):
        # poison the ignored keys' inputs: they must not leak
        k = np.where(kpm[:, :, None], r.pick((NAN, INF, -INF)), k)
        v = np.where(kpm[:, :, None], r.pick((NAN, INF, -INF)), v)
    num_heads = H
    key_ndim_fault = False

    query_4d = False
    if r.chance(1, 6):
        which = r.int(0, 15)
        if which == 0:
            num_heads = r.pick((float(H), True, "2", None))
            case.fault(f"num_heads={num_heads!r}", TypeError, "num_heads")
        elif which == 1:
            num_heads = r.pick((0, -1, E + 1 if E > 1 else 0))
            case.fault(f"num_heads={num_heads}", ValueError, "num_heads")
        elif which == 2:
            dt = pick_bad_dtype(r, case, "query")
        elif which == 3:
            kpm, kpm_dt = np.zeros((N, S + 1), bool), np.dtype(np.bool_)
            case.fault("key_padding_mask shape", ValueError, "key_padding_mask")
        elif which == 4:
            am, am_dt = np.zeros((L + 1, S), bool), np.dtype(np.bool_)
            case.fault("attn_mask shape", ValueError, "attn_mask")
        elif which == 5:
            kpm, kpm_dt = np.zeros((N, S)), r.pick((np.dtype(np.int64), np.dtype(np.uint8)))
            case.fault(f"key_padding_mask dtype {kpm_dt}", TypeError, "key_padding_mask")
        elif which == 6:
            key_ndim_fault = True
            case.fault("key ndim", ValueError, "key")
        elif which == 7:
            name = "k_proj_weight" if separate else "in_proj_weight"
            w = params[name]
            params[name] = np.zeros((w.shape[0] + 1, w.shape[1]))
            case.fault(f"{name} shape", ValueError, name)
        elif which == 8:
            f = r.pick(MHA_FLAGS)
            flags[f] = r.pick(FLAG_TYPE)
            case.fault(f"{f} not bool", TypeError, f)
        elif which == 9:
            if separate:
                params["in_proj_weight"] = np.zeros((3 * E, E))
            else:
                params["q_proj_weight"] = np.zeros((E, E))
            case.fault("both weight forms", ValueError, "in_proj_weight")
        elif which == 10:
            params["out_proj_weight"] = r.pick((np.zeros((E, E + 1)), np.zeros(E), None))
            case.fault("out_proj_weight not (E, E)", ValueError, "out_proj_weight")
        elif which == 11:
            query_4d = True
            case.fault("query 4-D", ValueError, "query")
        elif which == 12:
            q = grid(r, (N, L, E + 1), 1 / 64)
            case.fault("query E mismatch", ValueError, "query")
        elif which == 13:
            v = grid(r, (N, S + 1, vdim), 1 / 64)
            case.fault("value S mismatch", ValueError, "value")
        elif which == 14:
            name = r.pick(("q_proj_weight", "k_proj_weight", "v_proj_weight"))
            if separate:
                del params[name]
                case.fault(f"{name} missing", ValueError, name)
            else:
                params["in_proj_bias"] = np.zeros(3 * E + 1)
                case.fault("in_proj_bias shape", ValueError, "in_proj_bias")
        else:
            if r.bool():
                q = q.astype(np.float64).tolist() if q.size else q
                case.notes.append("ragged query")
                query_4d = "ragged"
            else:
                params["out_proj_bias"] = np.zeros(E + 2)
                case.fault("out_proj_bias shape", ValueError, "out_proj_bias")
            if query_4d == "ragged":
                case.fault("ragged query", TypeError, "query")

    bf = flags["batch_first"] if isinstance(flags["batch_first"], bool) else True

    def layout_input(x):
        if not batched:
            return x[0] if x.ndim == 3 else x
        return x if bf else np.swapaxes(x, 0, 1)

    if query_4d == "ragged":
        q = np.zeros((N, L, E))
    inputs = {"query": layout_input(q), "key": layout_input(k), "value": layout_input(v)}
    if key_ndim_fault:
        inputs["key"] = k[0] if batched else k      # 2-D with 3-D query, or the reverse
    if query_4d is True:
        x = inputs["query"]
        inputs["query"] = x.reshape((1,) * (4 - x.ndim) + x.shape)
    args = {}
    for name, x in inputs.items():
        lay, ro = pick_in_layout(r)
        args[name] = build_array(r, case.mem, x, dt if name == "query" else
                                 (dt if dt in FLOATS else np.dtype(np.float64)), lay, ro)
    if query_4d == "ragged":
        args["query"] = RAGGED
    pargs = {}
    for name, x in params.items():
        lay, ro = pick_in_layout(r)
        pargs[name] = None if x is None else build_array(r, case.mem, x, pdt, lay, ro)
    margs = {}
    for name, m, mdt in (("key_padding_mask", kpm, kpm_dt), ("attn_mask", am, am_dt)):
        if m is None:
            continue
        if name == "key_padding_mask" and not batched and m.ndim == 2:
            m = m[0]
        if name == "attn_mask" and not batched and m.ndim == 3 and m.shape[0] == N * H:
            m = m[:H]
        lay, ro = pick_in_layout(r)
        margs[name] = build_mask(r, case.mem, m, mdt, lay, ro)
    kwargs = {"num_heads": num_heads}
    kwargs.update(pargs)
    kwargs.update(margs)
    for f, val in flags.items():
        if val is not (f in ("need_weights", "average_attn_weights")) or r.bool():
            kwargs[f] = val
    case.fn = cyattn.multi_head_attention
    case.args = [args["query"], args["key"], args["value"]]
    case.kwargs = kwargs
    refs = {n: ref_copy(a) for n, a in {**args, **pargs, **margs}.items()}
    has_bias = ("in_proj_bias" in params) + ("out_proj_bias" in params)
    via_class = not case.faults and has_bias != 1 and r.chance(1, 3)
    if via_class:
        # the same call through MultiHeadAttention(...).load_state_dict(...)(...): parameters
        # are cast to the module dtype pdt
        case.notes.append(f"via MultiHeadAttention(dtype={pdt})")
        refs.update({n: np.asarray(refs[n], dtype=pdt) for n in pargs})
        case.fn = _mha_via_class(E, H, kdim, vdim, bool(has_bias), flags["batch_first"], pdt,
                                 pargs)
        case.kwargs = {n: v for n, v in kwargs.items() if n in margs or n in MHA_FLAGS
                       and n != "batch_first"}

    def verify(result):
        if not (isinstance(result, tuple) and len(result) == 2):
            fail(case, f"returned {type(result).__name__}, expected (output, weights)")
        out, w = result
        floats = [refs[n] for n in ("query", "key", "value") + tuple(pargs)]
        rdt = np.dtype(np.result_type(*floats))
        compute = CT.compute_dtype(*[f.dtype for f in floats])
        qn, kn, vn = refs["query"], refs["key"], refs["value"]
        if batched and not bf:
            qn, kn, vn = (np.swapaxes(x, 0, 1) for x in (qn, kn, vn))
        if not batched:
            qn, kn, vn = qn[None], kn[None], vn[None]
        plist = {n: refs[n].astype(np.float64).tolist() for n in pargs}
        kp, amr = refs.get("key_padding_mask"), refs.get("attn_mask")

        def olist(m):
            if m is None:
                return None
            if m.dtype == np.bool_:
                return m.tolist()
            return CT._mask_for_oracle(m, compute).astype(np.float64).tolist()

        outs, ws = [], []
        for n in range(N):
            kp_n = None if kp is None else (kp[n] if batched else kp)
            am_n = amr
            if amr is not None and amr.ndim == 3 and batched:
                am_n = amr[n * H:(n + 1) * H]
            o, wt = oracle.multi_head_attention(
                qn[n].astype(np.float64).tolist(), kn[n].astype(np.float64).tolist(),
                vn[n].astype(np.float64).tolist(), num_heads=H, **plist,
                key_padding_mask=olist(kp_n), attn_mask=olist(am_n),
                need_weights=flags["need_weights"],
                average_attn_weights=flags["average_attn_weights"],
                is_causal=flags["is_causal"])
            outs.append(np.array(o, dtype=np.float64).reshape(L, E))
            if flags["need_weights"]:
                wshape = (L, S) if flags["average_attn_weights"] else (H, L, S)
                ws.append(np.array(wt, dtype=np.float64).reshape(wshape))
            if not batched:
                break
        ref_out = np.stack(outs)
        if not batched:
            ref_out = ref_out[0]
        elif not bf:
            ref_out = np.swapaxes(ref_out, 0, 1)
        if not isinstance(out, np.ndarray) or out.dtype != rdt or out.shape != ref_out.shape:
            fail(case, f"output {getattr(out, 'shape', None)} {getattr(out, 'dtype', None)}; "
                       f"expected {ref_out.shape} {rdt}")
        kk = 3 * E + S + max(kdim, vdim)
        compare(case, "output", out, ref_out, rdt, kk)
        if not flags["need_weights"]:
            if w is not None:
                fail(case, "need_weights=False but weights were returned")
            return
        ref_w = np.stack(ws) if batched else ws[0]
        if not isinstance(w, np.ndarray) or w.dtype != rdt or w.shape != ref_w.shape:
            fail(case, f"weights {getattr(w, 'shape', None)} {getattr(w, 'dtype', None)}; "
                       f"expected {ref_w.shape} {rdt}")
        compare(case, "weights", w, ref_w, rdt, kk)

    case.verify = verify
    return case
