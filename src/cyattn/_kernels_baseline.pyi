"""Type stubs for a compiled kernel variant (the same API in every variant module)."""
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

VARIANT: Literal["baseline"]

def cpu_features() -> int: ...
def cpu_identity() -> tuple[str, int, int]: ...
def amx_request_permission() -> int: ...
def openmp_enabled() -> bool: ...
def omp_max_threads() -> int: ...
def omp_num_procs() -> int: ...
def omp_pause() -> int: ...
def plan_constants() -> dict[str, int]: ...
def exp_values(x: np.ndarray, out: np.ndarray, nonpos: bool = False) -> None: ...
def tanh_values(x: np.ndarray, out: np.ndarray) -> None: ...
def gelu_rows(
    h: npt.NDArray[np.float32], bias: npt.NDArray[np.float32] | None,
    p: npt.NDArray[np.float32], n_threads: int,
) -> None: ...
def layer_norm_rows(
    x: npt.NDArray[np.float32], weight: npt.NDArray[np.float32],
    bias: npt.NDArray[np.float32], eps: float, n_threads: int,
) -> None: ...
def half_to_float32(x: npt.NDArray[np.uint16], out: npt.NDArray[np.float32], fmt: int) -> None: ...
def float32_to_half(x: npt.NDArray[np.float32], out: npt.NDArray[np.uint16], fmt: int) -> None: ...
def kv8_to_float32(x: npt.NDArray[np.uint8], out: npt.NDArray[np.float32], fmt: int) -> None: ...
def softmax_rows_half(
    x: np.ndarray, out: np.ndarray, x_fmt: int, out_fmt: int, bmask: np.ndarray | None,
    amask: np.ndarray | None, a_fmt: int, b_rs: int, b_cs: int, a_rs: int, a_cs: int,
    log_out: bool, n_threads: int,
) -> None: ...
def softmax_rows(
    x: np.ndarray, out: np.ndarray, bmask: np.ndarray | None, amask: np.ndarray | None,
    b_rs: int, b_cs: int, a_rs: int, a_cs: int, log_out: bool, n_threads: int,
    stream_min: int = ...,
) -> None: ...
def softmax_stream_min_bytes() -> int: ...
def matmul_accumulate(
    a: np.ndarray, a_off: npt.NDArray[np.int64], rsa: int, csa: int,
    b: np.ndarray, b_off: npt.NDArray[np.int64], rsb: int, csb: int,
    out: np.ndarray, c_off: npt.NDArray[np.int64], rsc: int, csc: int,
    M: int, N: int, K: int, alpha: float, n_threads: int,
    a_fmt: int = 0, b_fmt: int = 0, c_fmt: int = 0,
) -> None: ...
BF16_DOT: bool
BF16_ARM: bool
BF16_RULE: Literal["x86", "arm"]
def matmul_accumulate_bf16(
    a: npt.NDArray[np.uint16], a_off: npt.NDArray[np.int64], rsa: int, csa: int,
    b: npt.NDArray[np.uint16], b_off: npt.NDArray[np.int64], rsb: int, csb: int,
    out: np.ndarray, c_off: npt.NDArray[np.int64], rsc: int, csc: int,
    M: int, N: int, K: int, alpha: float, n_threads: int,
    c_fmt: int = 0, emulate: bool = False, arm: bool = ...,
) -> None: ...
def bf16_dot_lanes(
    acc: npt.NDArray[np.float32], a: npt.NDArray[np.uint32], b: npt.NDArray[np.uint32],
    out: npt.NDArray[np.float32], emulate: bool = False, arm: bool = False,
) -> None: ...
AMX: bool
def matmul_accumulate_amx(
    a: npt.NDArray[np.uint16], a_off: npt.NDArray[np.int64], rsa: int, csa: int,
    b: npt.NDArray[np.uint16], b_off: npt.NDArray[np.int64], rsb: int, csb: int,
    out: np.ndarray, c_off: npt.NDArray[np.int64], rsc: int, csc: int,
    M: int, N: int, K: int, alpha: float, n_threads: int,
    c_fmt: int = 0, emulate: bool = False,
) -> None: ...
def amx_tile_product(
    a: npt.NDArray[np.uint16], b: npt.NDArray[np.uint16], c0: npt.NDArray[np.uint32],
    out: npt.NDArray[np.uint32], emulate: bool = False,
) -> None: ...
def packed_b_size(K: int, N: int) -> int: ...
def packed_b_layout() -> tuple[int, int]: ...
def pack_b_whole_into(
    b: npt.NDArray[np.float32], rsb: int, csb: int, K: int, N: int,
    out: npt.NDArray[np.float32],
) -> None: ...
def matmul_packed_b(
    a: npt.NDArray[np.float32], rsa: int, csa: int, packed: npt.NDArray[np.float32],
    out: npt.NDArray[np.float32], rsc: int, csc: int, M: int, N: int, K: int, alpha: float,
    n_threads: int,
) -> None: ...
def attention(
    q: np.ndarray, q_off: npt.NDArray[np.int64], q_rs: int, q_cs: int,
    k: np.ndarray, k_off: npt.NDArray[np.int64], k_rs: int, k_cs: int,
    v: np.ndarray, v_off: npt.NDArray[np.int64], v_rs: int, v_cs: int,
    mask: Any, mask_kind: int, m_off: npt.NDArray[np.int64], m_rs: int, m_cs: int,
    out: np.ndarray, lse: np.ndarray, L: int, S: int, E: int, Ev: int,
    scale: float, causal: bool, bottom_right: bool, want_lse: bool, n_threads: int,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    key_len: npt.NDArray[np.int64] | None = None,
    query_len: npt.NDArray[np.int64] | None = None,
    slopes: npt.NDArray[np.float64] | None = None,
    sinks: npt.NDArray[np.float64] | None = None, q_fmt: int = 0, kv_fmt: int = 0,
    o_off: npt.NDArray[np.int64] | None = None, o_rs: int = -1,
    k_scale: npt.NDArray[np.float32] | None = None,
    k_scale_off: npt.NDArray[np.int64] | None = None, k_scale_rs: int = 0,
    v_scale: npt.NDArray[np.float32] | None = None,
    v_scale_off: npt.NDArray[np.int64] | None = None, v_scale_rs: int = 0,
) -> bool: ...
def attention_bf16(
    q: np.ndarray, q_off: npt.NDArray[np.int64], q_rs: int, q_cs: int,
    k: np.ndarray, k_off: npt.NDArray[np.int64], k_rs: int, k_cs: int,
    v: np.ndarray, v_off: npt.NDArray[np.int64], v_rs: int, v_cs: int,
    mask: Any, mask_kind: int, m_off: npt.NDArray[np.int64], m_rs: int, m_cs: int,
    out: npt.NDArray[np.float32], lse: npt.NDArray[np.float32], L: int, S: int, E: int,
    Ev: int, scale: float, causal: bool, bottom_right: bool, want_lse: bool, n_threads: int,
    window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
    key_len: npt.NDArray[np.int64] | None = None,
    query_len: npt.NDArray[np.int64] | None = None,
    slopes: npt.NDArray[np.float64] | None = None,
    sinks: npt.NDArray[np.float64] | None = None, emulate: bool = False,
    tiles: bool = False, arm: bool = ...,
) -> bool: ...
