"""The optional peers of the full harness besides PyTorch: ONNX Runtime and JAX.

Each builder below returns ``(call, result)``: ``call()`` is the timed zero-argument call and
``result()`` returns the peer's answer as a NumPy array laid out like cyattn's, for the check
that runs before timing (a peer whose answer differs from cyattn's is reported, not timed).

ONNX Runtime ("ort"): one session per call shape, built with ``onnx.helper``: ``Softmax``
(axis -1; with a bool mask, ``Where(mask, x, -inf)`` first), ``Gemm`` with ``C`` for
matmul-accumulate (``Y = A B + C``), and the opset-23 ``Attention`` operator with 4-D inputs
(B, H, L, E), ``is_causal`` and a bool mask (True = take part; ORT 1.31 wants the mask's
second-to-last axis to be L, so the (B, 1, 1, S) padding mask is broadcast to (B, 1, L, S)
before timing). Sessions run sequentially (``inter_op_num_threads = 1``) with
``intra_op_num_threads`` = the column's thread count; inputs and a preallocated output are bound
once with an IOBinding, so a call is ``run_with_iobinding`` alone (no allocation, no copy).

JAX ("jax"): ``jax.jit`` of ``jax.nn.softmax`` (masked: ``jnp.where(mask, x, -inf)`` first),
``c + a @ b`` and ``jax.nn.dot_product_attention`` (inputs transposed once, before timing, to
its (B, T, N, H) layout), on arrays already on the device; a call waits for its result
(``block_until_ready``). XLA sizes its CPU thread pool once, when jax is imported, from the
``NPROC`` environment variable (else the CPUs this process may run on): see :data:`JAX_ENV`.
The harness therefore runs each thread count's column in its own process when JAX is a peer
(:func:`cyattn._bench.runner.run_full`).
"""
import importlib.util

import numpy as np

# Environment that pins XLA's CPU thread pool to n threads; it must be set before jax is
# imported. Measured on the 2-core build host (jax 0.10.2) from each thread's CPU ticks over
# 30 calls of a 1024^3 matmul, softmax and attention: NPROC=1 ran everything on one thread,
# while XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" alone
# still spread the work over four threads.
JAX_ENV = "NPROC"

_modules = {}


def _module(name):
    if name not in _modules:
        try:
            _modules[name] = importlib.import_module(name)
        except ImportError:
            _modules[name] = None
    return _modules[name]


def ort_module():
    """The onnxruntime module if onnxruntime and onnx are installed (imported once), else None."""
    if _module("onnx") is None:
        return None
    return _module("onnxruntime")


def jax_module():
    """The jax module if it is installed (imported once: see :data:`JAX_ENV`), else None."""
    return _module("jax")


def installed(peer):
    """Whether ``peer`` ("torch", "ort" or "jax") can be imported, without importing it."""
    names = {"torch": ("torch",), "ort": ("onnxruntime", "onnx"), "jax": ("jax", "jaxlib")}
    return all(importlib.util.find_spec(n) is not None for n in names[peer])


def versions(peers):
    """Dict of installed package versions for the peers in ``peers`` (from their metadata)."""
    from importlib import metadata
    pkgs = {"torch": ("torch",), "ort": ("onnxruntime", "onnx"), "jax": ("jax", "jaxlib")}
    out = {}
    for peer in peers:
        for pkg in pkgs.get(peer, ()):
            try:
                out[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                pass
    return out


# ------------------------------------------------------------------------------------------
# ONNX Runtime
# ------------------------------------------------------------------------------------------

_OPSET = 23
_IR_VERSION = 11          # ONNX IR version of opset 23 (onnx 1.23 writes 14, newer than ORT 1.31)


def _ort_session(nodes, inputs, output, n_threads, initializers=()):
    """A CPU session of the graph ``nodes`` with ``inputs`` (name -> array) and one float32
    ``output`` array, bound once (IOBinding); returns the timed call."""
    import onnxruntime as ort
    from onnx import TensorProto, helper
    dtypes = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.bool_): TensorProto.BOOL}
    graph = helper.make_graph(
        nodes, "cyattn_bench",
        [helper.make_tensor_value_info(n, dtypes[a.dtype], a.shape) for n, a in inputs.items()],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, output.shape)],
        initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = _IR_VERSION
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(n_threads or 1)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    io = sess.io_binding()
    for name, a in inputs.items():
        io.bind_cpu_input(name, a)
    io.bind_output("Y", "cpu", 0, np.float32, list(output.shape), output.ctypes.data)

    def call():
        sess.run_with_iobinding(io)
        return output
    call.session = sess            # keeps the session alive with the call
    return call


def ort_softmax(x, mask, n_threads, out=None):
    """Softmax over the last axis of float32 ``x`` (``mask``: bool, True = take part), into
    ``out`` (bound once; a new array if None)."""
    from onnx import helper, numpy_helper
    out = np.empty_like(x) if out is None else out
    if mask is None:
        call = _ort_session([helper.make_node("Softmax", ["X"], ["Y"], axis=-1)], {"X": x},
                            out, n_threads)
    else:
        ninf = numpy_helper.from_array(np.array(-np.inf, np.float32), "NINF")
        call = _ort_session([helper.make_node("Where", ["M", "X", "NINF"], ["Z"]),
                             helper.make_node("Softmax", ["Z"], ["Y"], axis=-1)],
                            {"X": x, "M": np.ascontiguousarray(mask)}, out, n_threads,
                            initializers=[ninf])
    return call, lambda: call().copy()


def ort_matmul_accumulate(a, b, c, n_threads):
    """``Gemm``: ``Y = a @ b + c`` into a preallocated Y; the check compares ``Y - c`` with
    ``a @ b`` (``c`` is zeros in the harness)."""
    from onnx import helper
    out = np.empty_like(c)
    call = _ort_session([helper.make_node("Gemm", ["A", "B", "C"], ["Y"])],
                        {"A": a, "B": b, "C": c}, out, n_threads)
    return call, lambda: call() - c


def ort_attention(q, k, v, keep, causal, scale, n_threads):
    """Opset-23 ``Attention`` on (B, H, L, E) inputs; ``keep`` (B, 1, 1, S) bool or None."""
    from onnx import helper
    B, H, L, _ = q.shape
    inputs = {"Q": q, "K": k, "V": v}
    if keep is not None:
        inputs["M"] = np.ascontiguousarray(np.broadcast_to(keep, (B, 1, L, keep.shape[-1])))
    out = np.empty((B, H, L, v.shape[-1]), np.float32)
    node = helper.make_node("Attention", list(inputs), ["Y"], is_causal=int(bool(causal)),
                            scale=float(scale))
    call = _ort_session([node], inputs, out, n_threads)
    return call, lambda: call().copy()


# ------------------------------------------------------------------------------------------
# JAX
# ------------------------------------------------------------------------------------------

_jitted = {}


def _jit(name):
    """The jitted functions, built once per process."""
    if not _jitted:
        import jax
        import jax.numpy as jnp

        def masked_softmax(x, m):
            return jax.nn.softmax(jnp.where(m, x, -jnp.inf), axis=-1)

        def attention(q, k, v, m, causal, scale):
            return jax.nn.dot_product_attention(q, k, v, mask=m, scale=scale, is_causal=causal)
        _jitted.update(
            softmax=jax.jit(lambda x: jax.nn.softmax(x, axis=-1)),
            masked_softmax=jax.jit(masked_softmax),
            matmul_accumulate=jax.jit(lambda c, a, b: c + a @ b),
            attention=jax.jit(attention, static_argnames=("causal", "scale")))
    return _jitted[name]


def _ready(f, *args, **kwargs):
    def call():
        return f(*args, **kwargs).block_until_ready()
    return call


def jax_softmax(x, mask):
    """``jax.nn.softmax`` over the last axis (masked: ``where(mask, x, -inf)`` first)."""
    import jax
    xj = jax.device_put(x)
    if mask is None:
        call = _ready(_jit("softmax"), xj)
    else:
        call = _ready(_jit("masked_softmax"), xj, jax.device_put(mask))
    return call, lambda: np.asarray(call())


def jax_matmul_accumulate(a, b, c):
    """``c + a @ b`` (a new array; the check subtracts ``c``, zeros in the harness)."""
    import jax
    aj, bj, cj = (jax.device_put(t) for t in (a, b, c))
    call = _ready(_jit("matmul_accumulate"), cj, aj, bj)
    return call, lambda: np.asarray(call()) - c


def jax_attention(q, k, v, keep, causal, scale):
    """``jax.nn.dot_product_attention`` on inputs transposed to (B, T, N, H) before timing; the
    result is transposed back to (B, H, L, E) for the check."""
    import jax
    qj, kj, vj = (jax.device_put(np.ascontiguousarray(np.swapaxes(t, 1, 2))) for t in (q, k, v))
    mj = None if keep is None else jax.device_put(keep)
    call = _ready(_jit("attention"), qj, kj, vj, mj, causal=bool(causal), scale=float(scale))
    return call, lambda: np.swapaxes(np.asarray(call()), 1, 2)

