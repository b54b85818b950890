"""softmax and log_softmax cases of the fuzz harness: ``build_softmax`` decodes one call
(shapes, axis, masks, layouts, ``out=``, faults) and attaches its check against the oracle.
"""
import math

import numpy as np

import cyattn
from checks_common import (_NO_OUT, CT, FLOATS, INF, NAN, bits, build_array, build_mask,
                           check_no_alias, compare, fail, gen_float_mask, grid, make_out,
                           pick_bad_dtype, pick_float, pick_in_layout, reduce_shape, ref_copy)

DIMS = (1, 2, 3, 4, 5, 0, 7, 8, 9, 17, 33, 31, 32, 64, 65, 100)


def _moved_rows(arr, axis):
    return np.moveaxis(arr, axis, -1)


def build_softmax(r, case, log):
    fname = case.fname
    dtype = pick_float(r)
    ndim = r.int(1, 4)
    shape = [r.pick(DIMS) for _ in range(ndim)]
    while math.prod(shape) > 600:
        shape[shape.index(max(shape))] //= 2
    shape = tuple(shape)
    axis_default = r.chance(1, 3)
    axis = r.int(-ndim, ndim - 1)
    scale = r.pick((1.0, 8.0, 0.125, 32.0, 1024.0))    # 32: exp underflows to subnormals
    x = grid(r, shape, scale / 32, r.pick((0, 1, 2)))

    mask_kind = r.pick(("none", "bool", "float", "none"))
    mask = mdt = None
    if mask_kind != "none":
        mshape = reduce_shape(r, shape)
        if mask_kind == "bool":
            mask = bits(r, mshape, r.pick((0.5, 0.875, 0.125, 1.0)))
            mdt = np.dtype(np.bool_)
            if r.chance(1, 2) and mask.ndim and mask.size:
                # kill a whole row along the axis (a fully masked row)
                ax = axis % ndim - (ndim - mask.ndim)
                if ax >= 0:
                    idx = [r.int(0, max(s - 1, 0)) for s in mask.shape]
                    idx[ax] = slice(None)
                    mask[tuple(idx)] = False
            if r.chance(1, 2):
                # poison every position the mask removes
                full = np.broadcast_to(mask, shape)
                x = np.where(full, x, r.pick((NAN, INF, -INF)))
        else:
            mask, mdt = gen_float_mask(r, mshape, dtype)

    # faults
    x_dtype = dtype
    if r.chance(1, 6):
        which = r.int(0, 7)
        if which == 0:
            x_dtype = pick_bad_dtype(r, case, "x")
        elif which == 1:
            x = x.reshape(-1)[:1].reshape(()) if x.size else np.zeros(())
            mask = None
            case.fault("x 0-d", ValueError, "x")
        elif which == 2:
            axis_default = False
            axis = r.pick((ndim, -ndim - 1, 10**20))
            case.fault(f"axis={axis}", ValueError, "axis")
        elif which == 3:
            axis_default = False
            axis = r.pick((1.0, True, "0", None))
            case.fault(f"axis={axis!r}", TypeError, "axis")
        elif which == 4:
            mask = np.zeros(shape, np.float64) if mask is None else mask
            mdt = r.pick((np.dtype(np.int64), np.dtype(np.uint8), np.dtype(np.complex64)))
            case.fault(f"mask dtype {mdt}", TypeError, "mask")
        elif which == 5:
            mask = np.ones((2,) + shape, bool)
            mdt = np.dtype(np.bool_)
            case.fault("mask enlarges", ValueError, "mask")
        elif which == 6 and ndim:
            mshape = shape[:-1] + (shape[-1] + 2,)     # never broadcasts (also for 0)
            mask = np.ones(mshape, bool)
            mdt = np.dtype(np.bool_)
            case.fault("mask shape", ValueError, "mask")

    xl, ro = pick_in_layout(r)
    if x.ndim == 0 and xl not in ("C", "list"):
        xl = "C"
    x_arg = build_array(r, case.mem, x, x_dtype, xl, ro, slack=r.pick((0, 64)))
    mask_arg = None
    if mask is not None:
        ml, mro = pick_in_layout(r)
        mask_arg = build_mask(r, case.mem, mask, mdt, ml, mro)

    x_ref = ref_copy(x_arg)
    result_dtype = x_ref.dtype if x_ref.dtype in FLOATS else None
    kwargs = {}
    if not axis_default:
        as_np = (r.chance(1, 4) and isinstance(axis, int) and not isinstance(axis, bool)
                 and abs(axis) < 2**62)
        kwargs["axis"] = np.int64(axis) if as_np else axis
    if mask is not None:
        kwargs["mask"] = mask_arg
    out = make_out(r, case, shape, result_dtype, inputs=[("x", x_arg), ("mask", mask_arg)])
    if out is not _NO_OUT:
        kwargs["out"] = out
        case.out = out
    case.fn = cyattn.log_softmax if log else cyattn.softmax
    case.args = [x_arg]
    case.kwargs = kwargs
    mask_ref = ref_copy(mask_arg)

    def verify(result):
        if case.out is not None and result is not case.out:
            fail(case, "with out=, the result is not out")
        if not isinstance(result, np.ndarray):
            fail(case, f"result is {type(result).__name__}")
        if result.shape != x_ref.shape or result.dtype != result_dtype:
            fail(case, f"result shape/dtype {result.shape} {result.dtype}; expected "
                       f"{x_ref.shape} {result_dtype}")
        if case.out is None:
            check_no_alias(case, result, [("x", x_arg), ("mask", mask_arg)])
        ax = kwargs.get("axis", -1)
        ax = int(ax) % x_ref.ndim
        expected = CT.oracle_softmax(x_ref, axis=ax, mask=mask_ref, log=log)
        loose = None
        if mask_ref is not None and mask_ref.dtype != np.bool_ and x_ref.size:
            # rows whose largest permitted score is a huge finite shift: the compute dtype
            # rounds every score of the row, so only the NaN / inf pattern is checked there
            compute = CT.compute_dtype(x_ref.dtype)
            m = np.broadcast_to(CT._mask_for_oracle(mask_ref, compute).astype(np.float64),
                                x_ref.shape)
            with np.errstate(all="ignore"):
                z = x_ref.astype(np.float64) + m
            zf = np.where(np.isfinite(z), z, -np.inf)
            rmax = _moved_rows(zf, ax).max(axis=-1, keepdims=True) if x_ref.shape[ax] else None
            if rmax is not None:
                loose = np.moveaxis(np.broadcast_to(np.abs(rmax) > 1e4,
                                                    _moved_rows(zf, ax).shape), -1, ax)
        compare(case, fname, result, expected, result_dtype, k=x_ref.shape[ax], loose=loose)
        # exact zeros (masked entries, fully masked rows, float64 underflow) stay exact
        zero = (expected == -np.inf) if log else (expected == 0)
        if loose is not None:
            zero &= ~loose
        bad = zero & ~(np.asarray(result) == (-np.inf if log else 0))
        if bad.any():
            fail(case, f"{fname}: entries that must be exactly {'-inf' if log else '0'} are "
                       f"{np.asarray(result)[bad][:5]}")
        if not log:
            # subnormal results are kept (no flush to zero)
            tiny = np.finfo(result_dtype).smallest_subnormal
            flushed = (expected >= 4 * float(tiny)) & (np.asarray(result) == 0)
            if loose is not None:
                flushed &= ~loose
            if flushed.any():
                fail(case, f"{fname}: results flushed to 0 where the reference is "
                           f"{expected[flushed][:5]}")

    case.verify = verify
    return case
