"""GLA's chunked forward in TileLang: the book's third form of it, beside the Triton chunk-parallel one
(`chunk.py` with attention_kernels/linear/chunk.py) and the source article's sequential chunk kernel
(`sequential_chunk.py`), in TileLang's tile language.

The math is the Triton form's (attention_kernels/linear/chunk.py): chunks of BT = 64 tokens, b the
cumulative log-gate inside a chunk, S the state at the chunk's start,

    o_t    = scale · ( (q_t ⊙ e^{b_t})ᵀ S  +  Σ_{j ≤ t} A_tj v_j ),   A_tj = Σ_k q_tk k_jk e^{b_tk - b_jk}
    S_next = Diag(e^{b_C}) S  +  Σ_j (k_j ⊙ e^{b_C - b_j}) v_jᵀ

Everything here is TileLang, the in-chunk cumulative gates included (each kernel sums its chunk's gates
itself, `T.cumsum`, rather than reading them from a pass of their own); what is shared with the Triton
form is the gate floor (GATE_FLOOR: a gate of -inf counts as -110, so that differences of cumulative
gates are never -inf - -inf) and the chunk size. Two kernels, compiled on first use for each (K, V,
input dtype, gate dtype); B, T and H are runtime values:
- `_state_kernel`: one program per (64 key rows, 64 value columns, batch element and head). It walks the
  chunks in order with its [64, 64] block of the state in fp32 registers: it writes the state at every
  chunk start (in the input dtype, for the output kernel), then decays it by e^{b_C} and adds
  (K ⊙ e^{b_C - b})ᵀ V, a product on tensor cores. At the end it writes the final state (fp32).
- `_output_kernel`: one program per (block of value columns, chunk, batch element and head), every chunk
  in parallel. The inter-chunk term is (Q ⊙ e^b) S_start on tensor cores. The intra-chunk scores A are
  cut into four column blocks of 16 tokens (secondary chunking): the rows after a column block take it
  on tensor cores, Q and K re-based at the block's last token n (Q ⊙ e^{b - b_n}, K ⊙ e^{b_n - b}, both
  exponents <= 0); its own 16 rows (the diagonal block, j <= t) are summed elementwise in fp32 with
  exponents b_t - b_j <= 0. A (in the input dtype) then multiplies V.
The last chunk's rows past T are read as 0 (a gate of 0 leaves the cumulative gate as it is) and not
written.

What TileLang makes of it for sm_90a (`scripts/gla_tilelang_compile.py`, no GPU needed; K = V = 128,
bf16): every product becomes wgmma (the state pass's Kᵀ V with K read transposed from shared memory);
the tiles come in by plain 16-byte global loads guarded by the sequence's end (neither kernel has a
pipelined loop, so TileLang adds no TMA copies and no producer warps: 128 threads each). The state
pass: 80 registers, 40 KB of shared memory. The output kernel: 113 registers, 128 KB of shared memory
(one program per SM), the scores' tile placed where the state tile was once its product is done. No
spills.

TileLang is imported lazily (`attention_kernels.peers.tilelang`): this module imports anywhere, and
`interface.chunk_gla_tilelang` says so when TileLang is missing.
"""
# No `from __future__ import annotations`: TileLang reads the kernels' annotations (their shapes) as values.

import torch

from .. import peers
from ..linear.chunk import CHUNK, GATE_FLOOR, SUB_CHUNK

BT, BC = CHUNK, SUB_CHUNK  # tokens per chunk, per column block of the scores
BK_STATE, BV_STATE = 64, 64  # the state pass's block of the state: wgmma's M, and its N
BV_MAX = 128               # the output kernel's widest block of value columns (its fp32 accumulator)
THREADS = 128              # one warpgroup
HEAD_DIMS = (64, 128)      # the K and V these kernels are built for: multiples of the state block
DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
GATE_DTYPES = {**DTYPES, torch.float32: "float32"}


def _gate_loader(T):
    """The macro that loads a chunk's gates g[i_b, t0:t0 + BT, i_h, c0:c0 + width] into b_s (fp32): 0 past
    the sequence's end, GATE_FLOOR below it (a select, so a NaN stays NaN), then summed along the chunk."""
    @T.macro
    def load_gates(g, b_s, i_b, t0, i_h, c0, n_tokens, width: int):
        for t, c in T.Parallel(BT, width):
            b_s[t, c] = T.if_then_else(t0 + t < n_tokens, T.cast(g[i_b, t0 + t, i_h, c0 + c], T.float32), 0)
        for t, c in T.Parallel(BT, width):
            b_s[t, c] = T.if_then_else(b_s[t, c] < GATE_FLOOR, GATE_FLOOR, b_s[t, c])
        T.cumsum(b_s, dim=0)
    return load_gates


def _state_kernel(T, K, V, dtype, gate_dtype):
    """The state pass for head dims K, V. k [B, T, H, K], v [B, T, H, V], g [B, T, H, K] (gate_dtype),
    h0 fp32 [B, H, K, V]. Writes states [B, NT, H, K, V] (dtype): the state at every chunk's start, and
    ht fp32 [B, H, K, V]: the state after the last chunk."""
    f32, BK, BV = T.float32, BK_STATE, BV_STATE
    B, n_tokens, H, NT = T.dynamic("B"), T.dynamic("T"), T.dynamic("H"), T.dynamic("NT")
    load_gates = _gate_loader(T)

    @T.prim_func
    def gla_chunk_states_tilelang(
        k: T.Tensor([B, n_tokens, H, K], dtype), v: T.Tensor([B, n_tokens, H, V], dtype),
        g: T.Tensor([B, n_tokens, H, K], gate_dtype), h0: T.Tensor([B, H, K, V], f32),
        states: T.Tensor([B, NT, H, K, V], dtype), ht: T.Tensor([B, H, K, V], f32),
    ):
        with T.Kernel(K // BK, V // BV, B * H, threads=THREADS) as (i_k, i_v, i_bh):
            i_b, i_h = i_bh // H, i_bh % H
            k0, v0 = i_k * BK, i_v * BV
            k_s, v_s = T.alloc_shared([BT, BK], dtype), T.alloc_shared([BT, BV], dtype)
            b_s = T.alloc_shared([BT, BK], f32)
            k_decayed = T.alloc_shared([BT, BK], dtype)
            state = T.alloc_fragment([BK, BV], f32)
            T.copy(h0[i_b, i_h, k0:k0 + BK, v0:v0 + BV], state)
            for i_t in T.serial(NT):
                t0 = i_t * BT
                for r, c in T.Parallel(BK, BV):
                    states[i_b, i_t, i_h, k0 + r, v0 + c] = state[r, c]
                for t, c in T.Parallel(BT, BK):
                    k_s[t, c] = T.if_then_else(t0 + t < n_tokens, k[i_b, t0 + t, i_h, k0 + c], 0)
                for t, c in T.Parallel(BT, BV):
                    v_s[t, c] = T.if_then_else(t0 + t < n_tokens, v[i_b, t0 + t, i_h, v0 + c], 0)
                load_gates(g, b_s, i_b, t0, i_h, k0, n_tokens, BK)
                # b[BT - 1] is the chunk's total (the padded rows add 0): every exponent is <= 0
                for t, c in T.Parallel(BT, BK):
                    k_decayed[t, c] = T.cast(k_s[t, c], f32) * T.exp(b_s[BT - 1, c] - b_s[t, c])
                for r, c in T.Parallel(BK, BV):
                    state[r, c] *= T.exp(b_s[BT - 1, r])
                T.gemm(k_decayed, v_s, state, transpose_A=True)
            T.copy(state, ht[i_b, i_h, k0:k0 + BK, v0:v0 + BV])
    return gla_chunk_states_tilelang


def _output_kernel(T, K, V, dtype, gate_dtype):
    """The output for head dims K, V. q, k [B, T, H, K], v [B, T, H, V],
    g [B, T, H, K] (gate_dtype), states [B, NT, H, K, V] (dtype, the state at
    every chunk's start), scale. Writes o [B, T, H, V]."""
    f32, BV = T.float32, min(V, BV_MAX)
    B, n_tokens, H, NT = T.dynamic("B"), T.dynamic("T"), T.dynamic("H"), T.dynamic("NT")
    load_gates = _gate_loader(T)

    @T.prim_func
    def gla_chunk_output_tilelang(
        q: T.Tensor([B, n_tokens, H, K], dtype), k: T.Tensor([B, n_tokens, H, K], dtype),
        v: T.Tensor([B, n_tokens, H, V], dtype), g: T.Tensor([B, n_tokens, H, K], gate_dtype),
        states: T.Tensor([B, NT, H, K, V], dtype), scale: T.float32,
        o: T.Tensor([B, n_tokens, H, V], dtype),
    ):
        with T.Kernel(V // BV, NT, B * H, threads=THREADS) as (i_v, i_t, i_bh):
            i_b, i_h = i_bh // H, i_bh % H
            t0, v0 = i_t * BT, i_v * BV
            q_s, k_s = T.alloc_shared([BT, K], dtype), T.alloc_shared([BT, K], dtype)
            b_s = T.alloc_shared([BT, K], f32)
            v_s, h_s = T.alloc_shared([BT, BV], dtype), T.alloc_shared([K, BV], dtype)
            q_rebased, k_rebased = T.alloc_shared([BT, K], dtype), T.alloc_shared([BC, K], dtype)
            a_s = T.alloc_shared([BT, BT], dtype)
            acc = T.alloc_fragment([BT, BV], f32)
            block = T.alloc_fragment([BT, BC], f32)
            diagonal = T.alloc_fragment([BT, BC], f32)

            for t, c in T.Parallel(BT, K):
                q_s[t, c] = T.if_then_else(t0 + t < n_tokens, q[i_b, t0 + t, i_h, c], 0)
                k_s[t, c] = T.if_then_else(t0 + t < n_tokens, k[i_b, t0 + t, i_h, c], 0)
            for t, c in T.Parallel(BT, BV):
                v_s[t, c] = T.if_then_else(t0 + t < n_tokens, v[i_b, t0 + t, i_h, v0 + c], 0)
            T.copy(states[i_b, i_t, i_h, 0:K, v0:v0 + BV], h_s)
            load_gates(g, b_s, i_b, t0, i_h, 0, n_tokens, K)

            # inter-chunk: (Q ⊙ e^b) S_start, b <= 0
            for t, c in T.Parallel(BT, K):
                q_rebased[t, c] = T.cast(q_s[t, c], f32) * T.exp(b_s[t, c])
            T.gemm(q_rebased, h_s, acc, clear_accum=True)

            # the diagonal blocks, elementwise:
            # diagonal[t, j] = A[t, t0' + j] with t0' the first row of t's
            # block, for j <= t - t0' (exponent <= 0); 0 above (the select
            # skips the exponential)
            T.clear(diagonal)
            for c in T.serial(K):
                for t, j in T.Parallel(BT, BC):
                    diagonal[t, j] += T.if_then_else(
                        j <= t % BC,
                        T.cast(q_s[t, c], f32) * T.cast(k_s[t - t % BC + j, c], f32)
                        * T.exp(b_s[t, c] - b_s[t - t % BC + j, c]), 0)
            T.clear(a_s)
            for t, j in T.Parallel(BT, BC):
                a_s[t, t - t % BC + j] = diagonal[t, j]
            # the blocks below the diagonal, column block by column block on
            # tensor cores, re-based at the block's last token n: the rows
            # after the block have b <= b_n, the block's own b >= b_n
            for i_c in T.serial(BT // BC - 1):
                n = i_c * BC + BC - 1
                for t, c in T.Parallel(BT, K):
                    q_rebased[t, c] = T.cast(q_s[t, c], f32) * T.exp(T.min(b_s[t, c] - b_s[n, c], 0))
                for j, c in T.Parallel(BC, K):
                    k_rebased[j, c] = T.cast(k_s[i_c * BC + j, c], f32) * T.exp(b_s[n, c] - b_s[i_c * BC + j, c])
                T.gemm(q_rebased, k_rebased, block, transpose_B=True, clear_accum=True)
                for t, j in T.Parallel(BT, BC):
                    if t > n:
                        a_s[t, i_c * BC + j] = block[t, j]

            # intra-chunk: A V
            T.gemm(a_s, v_s, acc)
            for t, c in T.Parallel(BT, BV):
                if t0 + t < n_tokens:
                    o[i_b, t0 + t, i_h, v0 + c] = acc[t, c] * scale
    return gla_chunk_output_tilelang


_KERNELS: dict = {}  # (builder, K, V, dtype, gate dtype) -> compiled kernel


def _compiled(build, *key):
    """The compiled kernel `build(T, *key)`, compiled on first use (a few seconds) for this machine's GPU;
    the key's last two entries are TileLang dtype names."""
    kernel = _KERNELS.get((build, *key))
    if kernel is None:
        tilelang = peers.tilelang()
        T = tilelang.language
        kernel = _KERNELS[(build, *key)] = tilelang.compile(build(T, *key[:-2], *(getattr(T, d) for d in key[-2:])))
    return kernel


def launch_tilelang(q, k, v, g, scale, h0, output_final_state):
    """Allocate and launch, for contiguous inputs `interface.chunk_gla_tilelang` has checked: the state pass,
    then the output. h0: fp32 [B, H, K, V] or None (zeros). Returns (o [B, T, H, V] in v's dtype, the final
    state fp32 [B, H, K, V] or None)."""
    B, T, H, K = q.shape
    V, dev = v.shape[-1], q.device
    key = (K, V, DTYPES[q.dtype], GATE_DTYPES[g.dtype])
    n_chunks = -(-T // BT)
    if h0 is None:
        h0 = torch.zeros(B, H, K, V, dtype=torch.float32, device=dev)
    states = torch.empty(B, n_chunks, H, K, V, dtype=q.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev)
    _compiled(_state_kernel, *key)(k, v, g, h0, states, ht)
    o = torch.empty_like(v)
    _compiled(_output_kernel, *key)(q, k, v, g, states, scale, o)
    return o, (ht if output_final_state else None)


__all__ = ["launch_tilelang", "BT", "BC", "HEAD_DIMS", "DTYPES", "GATE_DTYPES"]
