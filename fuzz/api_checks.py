"""Decode fuzzer bytes into one call of a cyattn public function and check it (no atheris here).

``check_one(data)`` is the whole harness: ``fuzz/fuzz_api.py`` (atheris / libFuzzer) calls it for
every input, and ``tests/test_fuzz_corpus.py`` replays ``fuzz/corpus/`` through it with pytest.
It returns a short label of what ran and raises :class:`FuzzFailure` (an AssertionError) when
cyattn broke its contract (DESIGN sections 2-3):

* only TypeError / ValueError may be raised, and only when the decoded call has a deliberate
  fault (bad dtype, shape, mask, ``out``, flag, scale, axis, alpha or ``n_threads``); the type
  must be the documented one and the message must name the argument; a call without a fault
  must not raise at all;
* after a raise, every buffer (inputs, ``out`` and the bytes around them) is bit-for-bit as
  before; after a success only the bytes of ``out`` changed (inputs never, also when ``out``
  overlaps an input, and never the gaps of a strided ``out``);
* a success returns the documented object, shape and dtype (``out`` itself when given), no
  warning, and values that agree with ``cyattn.oracle`` (pure Python, exactly rounded sums)
  within the tolerances of ``tests/conftest.py``, with NaN and infinities in the same places:
  a NaN or inf at a masked position never leaks, fully masked rows are 0 with lse -inf;
  entries the reference has exactly 0 (softmax) / -inf (log_softmax) are exact, and subnormal
  softmax results are not flushed to 0;
* in the rare "big" cases (sizes that run on several threads) the result is bit-identical to
  an ``n_threads=1`` call, and agrees with a NumPy float64 reference.

Two allowances keep legitimate rounding from being reported: in a row whose largest permitted
score is a huge finite shift (a -1e9 or finfo.min float mask) only the NaN/inf pattern is
compared, and an attention row is not compared where a NaN/inf value sits at a key whose weight
underflows to 0 in the compute dtype but not in float64 (whether it is read then depends on
that rounding).

Kinds of case: everyday "plain" calls (which cyattn serves on fast paths), general calls with
every option, "long" attention rows (several 256-key blocks, the decode path's 512-key chunks
for L <= 4 and S >= 1024; values from a generator seeded by the input), "big" multi-threaded
calls, and calls with one deliberate fault. Each input also picks the kernel variant (of those
this machine runs), so a corpus file may exercise another variant on another machine.

Decoding: :class:`ByteReader` reads the input from the front, one decision at a time; an
exhausted input reads as zero bytes, and every choice list starts with its plainest option, so
any byte string (including the empty one) decodes to a valid case. It is a small
FuzzedDataProvider of our own, not atheris's, so that the corpus decodes identically without
atheris installed. Values are on a dyadic grid (exactly representable in float16, float32 and
float64; dot products of them are exact in float32), with NaN / +-inf / huge finite mask values
sprinkled in where a case asks for them.

Reference helpers and tolerances are imported from ``tests/conftest.py`` (the one place they are
set); the checkout's ``tests/`` folder must therefore sit next to ``fuzz/``.

This module is the dispatch and the contract checks common to every call; the decoding and
checks of each function family live beside it: ``checks_softmax.py`` (softmax, log_softmax),
``checks_attention.py`` (scaled_dot_product_attention), ``checks_matmul.py``
(matmul_accumulate), ``checks_mha.py`` (multi_head_attention, MultiHeadAttention), on top of
``checks_common.py`` (byte decoder, values, buffers and layouts, the Case record, comparison,
``out=``, float masks, and ``AVOID``).
"""
import pathlib
import sys
import warnings

import numpy as np

from cyattn import _backend

# The family modules sit beside this file; put them on the path also when this file is loaded
# by its path (tests/test_fuzz_corpus.py) rather than run or imported from fuzz/.
_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import checks_common as common  # noqa: E402
from checks_attention import build_sdpa  # noqa: E402
from checks_common import VARIANTS, ByteReader, Case, FuzzFailure, covered, fail  # noqa: E402
from checks_matmul import build_matmul  # noqa: E402
from checks_mha import build_mha  # noqa: E402
from checks_softmax import build_softmax  # noqa: E402

import checks_variants  # noqa: E402

__all__ = ["check_one", "describe", "FuzzFailure", "ByteReader"]


# ------------------------------------------------------------------------------------------
# The harness
# ------------------------------------------------------------------------------------------

FUNCTIONS = ("scaled_dot_product_attention", "softmax", "matmul_accumulate",
             "multi_head_attention", "log_softmax", "scaled_dot_product_attention")


def build_case(data):
    r = ByteReader(data)
    fname = r.pick(FUNCTIONS)
    variant = VARIANTS[r.int(0, len(VARIANTS) - 1)]
    case = Case(fname)
    case.notes.append(variant)
    case.variant = variant
    if fname in ("softmax", "log_softmax"):
        build_softmax(r, case, fname == "log_softmax")
    elif fname == "matmul_accumulate":
        build_matmul(r, case)
    elif fname == "scaled_dot_product_attention":
        if checks_variants.selected(r):    # issue 24's arguments: fuzz/checks_variants.py
            checks_variants.build(r, case, common)
        else:
            build_sdpa(r, case)
    else:
        build_mha(r, case)
    return case


def describe(data):
    """A readable summary of the call ``data`` decodes to."""
    return build_case(data).describe()


def _names_ok(exc, names):
    msg = str(exc)
    return any(n in msg for n in names)


def check_one(data):
    """Decode ``data`` into one cyattn call, run it and check the contract (see the module
    docstring). Returns "ok:<fname>" or "raised:<fname>:<ExcType>"; raises FuzzFailure."""
    case = build_case(data)
    before = case.mem.snapshot()
    saved = _backend.kernels
    _backend.kernels = _backend.load_variant(case.variant)
    err = None
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                result = case.fn(*case.args, **case.kwargs)
            except (TypeError, ValueError) as exc:
                err = exc
            except Exception as exc:    # noqa: BLE001 - any other type breaks the contract
                fail(case, f"raised {type(exc).__name__}: {exc}")
        if err is not None:
            allowed = dict(case.must)
            for t, n in case.may.items():
                allowed.setdefault(t, []).extend(n)
            if not allowed:
                fail(case, f"a valid call raised {type(err).__name__}: {err}")
            names = [n for t, ns in allowed.items() if isinstance(err, t) for n in ns]
            if not names:
                fail(case, f"raised {type(err).__name__} ({err}); expected "
                           f"{sorted(t.__name__ for t in allowed)}")
            if not _names_ok(err, names):
                fail(case, f"the message does not name any of {names}: {err}")
            for raw, old in zip(case.mem.raws, before):
                if not np.array_equal(raw, old):
                    fail(case, f"{type(err).__name__} raised, but a buffer changed "
                               f"(input or out): {err}")
            return f"raised:{case.fname}:{type(err).__name__}"
        if case.must:
            fail(case, f"expected {sorted(t.__name__ for t in case.must)}, but the call "
                       f"succeeded")
        out = case.out if isinstance(case.out, np.ndarray) else None
        for raw, old in zip(case.mem.raws, before):
            if out is not None and case.mem.owner(out) is raw:
                region = covered(raw, out)
                if not np.array_equal(raw[~region], old[~region]):
                    fail(case, "bytes outside out (an input or a gap of out) changed")
            elif not np.array_equal(raw, old):
                fail(case, "an input buffer changed")
        if caught and not (case.fname == "multi_head_attention"
                           and "mha-mask-warning" in common.AVOID
                           and all(isinstance(m, np.ndarray) and m.dtype.kind == "f"
                                   for m in (case.kwargs.get("key_padding_mask"),
                                             case.kwargs.get("attn_mask")))):
            fail(case, f"warning: {caught[0].category.__name__}: {caught[0].message}")
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")       # the references' own NaN arithmetic
            case.verify(result)
        return f"ok:{case.fname}"
    finally:
        _backend.kernels = saved


def _main(argv):
    """python fuzz/api_checks.py FILE...: describe and check each input file."""
    status = 0
    for path in argv:
        data = pathlib.Path(path).read_bytes()
        print(f"== {path} ({len(data)} bytes)")
        print(describe(data))
        try:
            print("->", check_one(data))
        except FuzzFailure as exc:
            status = 1
            print("-> FAILED:", exc)
    return status


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
