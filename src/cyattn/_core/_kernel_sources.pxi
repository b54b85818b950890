# The kernel source files, in the order the variant modules compile them. Each variant module
# (_kernels_baseline.pyx, _kernels_avx2.pyx, _kernels_avx512.pyx) defines its micro-kernel tile
# and then includes this list; each file opens with the design note of its concern.
include "_kernel_common.pxi"      # imports, C helpers, variant-independent blocking constants
include "_exp.pxi"                # exp and tanh (float32/float64)
include "_softmax_rows.pxi"       # softmax / log_softmax rows, masked and unmasked
include "_encoder_rows.pxi"       # bias + GELU and LayerNorm rows (cyattn.encoder)
include "_gemm.pxi"               # packing, micro-kernels, GEMM drivers (matmul_accumulate)
include "_gemm_bf16.pxi"          # bf16 GEMM on bf16 dot products (precision="fast")
include "_gemm_amx.pxi"           # bf16 GEMM on AMX tiles (hardware or the portable model)
include "_attention_variants.pxi" # row limits (causal, window, lengths), softcap, ALiBi, sinks
include "_attention_fused.pxi"    # fused attention: tasks, panels, masks, online softmax
include "_attention_two_pass.pxi" # the two-pass path that redoes non-finite rows
include "_attention_bf16.pxi"     # bf16 attention on bf16 dot products (precision="fast")
include "_attention_decode.pxi"   # decode: a few query rows streamed over K and V
include "_attention_decode_grouped.pxi"  # decode: the query heads of a K/V head as one task
include "_entry_buffers.pxi"      # entry points' shared buffer, dtype, layout and overlap checks
include "_entry_rows.pxi"         # def functions: exp/tanh, GELU/LayerNorm, half casts, softmax
include "_entry_matmul.pxi"       # def functions: matmul_accumulate, packed B, matmul_fast
include "_entry_attention.pxi"    # def functions: attention_run, attention, attention_fast
include "_entry_attention_bf16.pxi"  # def function: attention_bf16 (precision="fast")
include "_probes.pxi"             # CPU features, OpenMP runtime, FMA peak probe
