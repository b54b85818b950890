"""matmul_accumulate cases of the fuzz harness: ``build_matmul`` decodes one call (batch
broadcasting, alpha, ``out`` overlapping an input, layouts, faults) and attaches its check.
"""
import fractions
import math

import numpy as np

import cyattn
from checks_common import (CT, FLOATS, INF, NAN, OUT_LAYOUTS, build_array, compare, fail, grid,
                           pick_bad_dtype, pick_float, pick_in_layout, pick_threads, reduce_shape,
                           ref_copy)

MM_DIMS = (1, 2, 3, 4, 5, 0, 8, 13, 17, 33, 24, 25, 48)
ALPHAS = (1.0, -0.5, 0.0, 3.0, 1e-3, -0.0, 2, np.float32(0.5), fractions.Fraction(1, 4),
          INF, NAN, -INF, np.float16(2.0))
ALPHA_TYPE = ("1", None, True, 1j, [1.0])


def build_matmul(r, case):
    big = r.chance(1, 40)
    # plain: 2-D C-contiguous float32/float64 operands of one dtype, a fresh C out, a float
    # alpha: the everyday call, which cyattn may serve on a fast path
    plain = r.chance(1, 4)
    dta = pick_float(r)
    dtb = dta if not r.chance(1, 4) else pick_float(r)
    ob = tuple(0 if r.chance(1, 16) else r.pick((1, 2, 3)) for _ in range(r.int(0, 2)))
    ab, bb = reduce_shape(r, ob), reduce_shape(r, ob)
    if r.chance(1, 6):
        ob = (2,) + ob              # out may have more batch dims than a and b
    M, N, K = r.pick(MM_DIMS), r.pick(MM_DIMS), r.pick(MM_DIMS)
    if plain:
        dta = dtb = r.pick((np.dtype(np.float32), np.dtype(np.float64)))
        ab = bb = ob = ()
        case.notes.append("plain call")
    if big:
        ab, bb, ob = ((), (), ()) if plain else ((2,), (), (2,))
        M, N, K = 150, 72, 300          # > MC = 144 rows, > KC = 256 deep
    while not big and math.prod(ob) * M * N * max(K, 1) > 12000:
        M, N, K = max(M // 2, 1), max(N // 2, 1), max(K // 2, 1)
    specials = 0 if big else r.pick((0, 1, 0, 2))
    unit = r.pick((1, 1, 64)) / 32          # 64: results beyond float16's range
    a = grid(r, ab + (M, K), unit, specials)
    b = grid(r, bb + (K, N), unit, specials)
    out0 = grid(r, ob + (M, N), unit, specials)
    alpha = r.pick(ALPHAS) if not big else r.pick((1.0, -0.5, 0.25))
    alpha_default = alpha == 1.0 and r.bool()
    out_dt = "result"

    arrays = [a, b]
    dts = [dta, dtb]
    out_fault = None
    if not big and not plain and r.chance(1, 6):
        which = r.int(0, 10)
        if which == 0:
            i = r.int(0, 1)
            dts[i] = pick_bad_dtype(r, case, "ab"[i])
        elif which == 1:
            out_dt = r.pick((np.dtype(np.int32), np.dtype(np.bool_), np.dtype(np.complex64)))
            case.fault(f"out dtype {out_dt}", TypeError, "out")
        elif which == 2:
            out_dt = "other float"
            case.fault("out dtype another float", ValueError, "out")
        elif which == 3:
            out0 = np.zeros(ob + (M, N + 1))
            case.fault("out shape", ValueError, "out")
        elif which == 4:
            out_fault = r.pick(("ro", "list"))
            case.fault(f"out {out_fault}", ValueError, "out")
        elif which == 5:
            i = r.int(0, 1)
            arrays[i] = arrays[i].reshape(-1)[:2]
            case.fault(f"{'ab'[i]} 1-D", ValueError, "ab"[i])
        elif which == 6:
            arrays[1] = grid(r, bb + (K + 1, N), 1 / 32)
            case.fault("K mismatch", ValueError, "a", "b")
        elif which == 7:
            arrays = [np.zeros((2, 1, M, K)), np.zeros((3, 1, K, N))]
            case.fault("batch mismatch", ValueError, "out", "batch")
        elif which == 8:
            alpha_default = False
            alpha = r.pick(ALPHA_TYPE)
            case.fault(f"alpha={alpha!r}", TypeError, "alpha")
        elif which == 9:
            alpha_default = False
            alpha = 10**400
            case.fault("alpha=10**400", ValueError, "alpha")
        else:
            # a has batch (3,), out has none or (2,): the product does not fit out
            arrays = [np.zeros((3, M, K)), np.zeros((K, N))]
            out0 = np.zeros(r.pick(((), (2,))) + (M, N))
            case.fault("out batch cannot hold a @ b", ValueError, "out")
    a, b = arrays

    args = []
    for arr, dt in zip(arrays, dts):
        lay, ro = pick_in_layout(r, allow_bcast=not big)
        lay = "C" if plain else lay
        args.append(build_array(r, case.mem, arr, dt, lay, ro, slack=r.pick((0, 64, 512))))
    eff = [ref_copy(x).dtype for x in args]
    result = np.result_type(*eff) if all(d in FLOATS for d in eff) else np.dtype(np.float64)
    if out_dt == "result":
        out_dt = np.dtype(result)
    elif out_dt == "other float":
        out_dt = r.pick(tuple(d for d in FLOATS if d != result))
    out_mode = r.int(0, 9)
    out = None
    if out_fault == "ro":
        out = build_array(r, case.mem, out0, out_dt, "C", read_only=True)
    elif out_fault == "list":
        out = out0.tolist()
    elif out_mode >= 7 and not case.faults and not plain and not big:
        cands = [(n, x) for n, x in zip("ab", args) if isinstance(x, np.ndarray)
                 and x.dtype == out_dt and case.mem.owner(x) is not None]
        if cands:
            name, x = cands[r.int(0, len(cands) - 1)]
            raw = case.mem.owner(x)
            shape = ob + (M, N)
            item = out_dt.itemsize
            if x.shape == shape and x.flags.writeable and r.bool():
                out = x
                case.notes.append(f"out is {name}")
            else:
                start = x.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
                off = start + item * r.int(-3, 5)
                off -= off % item
                if off >= 0 and off + math.prod(shape) * item <= raw.size:
                    out = np.ndarray(shape, out_dt, buffer=raw, offset=off)
                    case.notes.append(f"out overlaps {name} (byte offset {off - start})")
    if out is None:
        lay = r.pick(OUT_LAYOUTS) if r.chance(1, 2) and not plain and not big else "C"
        case.notes.append(f"out layout {lay}")
        out = build_array(r, case.mem, out0, out_dt, lay)
    refs = [ref_copy(x) for x in args]
    out_ref = ref_copy(out)
    kwargs = {}
    if not alpha_default:
        kwargs["alpha"] = alpha
    pick_threads(r, case, kwargs, big, plain)
    case.fn = cyattn.matmul_accumulate
    case.args = [args[0], args[1], out]
    case.kwargs = kwargs
    case.out = out

    def verify(result):
        if result is not out:
            fail(case, "matmul_accumulate did not return out")
        al = float(alpha)
        finite = all(np.isfinite(x).all() for x in (refs[0], refs[1], out_ref))
        work = out_ref.size * max(refs[0].shape[-1], 1)
        with np.errstate(all="ignore"):
            if (finite and math.isfinite(al)) or work > 20000:
                ref = CT.numpy_matmul(refs[0], refs[1], out_ref, al)
            else:
                ref = CT.oracle_matmul(refs[0], refs[1], out_ref.astype(np.float64), al)
        compare(case, "out", out, ref, out.dtype, k=refs[0].shape[-1])
        if big:
            again = np.array(out_ref, copy=True)       # out is C-contiguous in big cases
            case.fn(args[0], args[1], again, alpha=alpha, n_threads=1)
            if not np.array_equal(again.view(np.uint8),
                                  np.ascontiguousarray(out).view(np.uint8)):
                fail(case, "out with n_threads=1 differs bitwise")

    case.verify = verify
    return case
