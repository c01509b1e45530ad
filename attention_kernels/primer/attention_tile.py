"""Step 3 of the primer: one block of queries against every key of one head, in one tile.

Program (i_m, b*H + h) owns query rows [i_m*BM, (i_m+1)*BM) of batch b, head h. It loads those
rows, all S keys and values of the head (S <= max_keys(dtype), padded to BN, a power of two >= 16), and
computes scores = Q K^T, a row softmax and P V with two tensor-core dot products. Nothing is
written but the output. Without an online softmax the keys must fit one tile: FlashAttention
lifts that limit.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..launch import LOG2E, launch, on_machine, pow2_at_least_16

MAX_HEAD_DIM = 128
# All keys of a head sit in one tile: K and V as [BN, BD] blocks in shared memory for the dot
# products (64 KiB each at BN = 256, BD = 128 in 16-bit types), the scores as [BM, BN] in registers.
MAX_KEYS = {2: 256, 4: 128}   # by element size in bytes: float16/bfloat16, float32


def max_keys(dtype) -> int:
    """The most keys S one tile holds for this dtype (at head dims up to MAX_HEAD_DIM)."""
    return MAX_KEYS[dtype.itemsize]


def tile_candidates(BN: int):
    """(BM, BN, num_warps, num_stages), best first: 64 query rows on the GPU,
    with 8 warps once the score tile is 64 x 256; 16 rows under the
    interpreter (one program at a time)."""
    warps = 8 if BN > 128 else 4
    return on_machine(gpu=[(64, BN, warps, 1), (32, BN, 4, 1)], interpreter=[(16, BN, 4, 1)])


@triton.jit(do_not_specialize=["T", "S", "H"])
def _attention_tile_kernel(p_q, p_k, p_v, p_o, T, S, H, qk_scale,
                           D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    i_m, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    o_m = i_m * BM + tl.arange(0, BM)       # this program's query rows
    o_n = tl.arange(0, BN)                  # every key of the head (padded to BN)
    o_d = tl.arange(0, BD)                  # the head dimension (padded to BD)
    m_m, m_n, m_d = o_m < T, o_n < S, o_d < D
    # [B, T, H, D], contiguous: element (b, t, h, d) sits at ((b*T + t)*H +
    # h)*D + d
    p_qm = p_q + ((i_b * T + o_m[:, None]).to(tl.int64) * H + i_h) * D + o_d[None, :]
    p_kn = p_k + ((i_b * S + o_n[:, None]).to(tl.int64) * H + i_h) * D + o_d[None, :]
    p_vn = p_v + ((i_b * S + o_n[:, None]).to(tl.int64) * H + i_h) * D + o_d[None, :]
    b_q = tl.load(p_qm, mask=m_m[:, None] & m_d[None, :], other=0.0)   # [BM, BD]
    b_k = tl.load(p_kn, mask=m_n[:, None] & m_d[None, :], other=0.0)   # [BN, BD]
    b_v = tl.load(p_vn, mask=m_n[:, None] & m_d[None, :], other=0.0)   # [BN, BD]
    # scores in base 2: qk_scale = softmax scale * log2(e); fp32 accumulation
    # on the tensor cores
    b_s = tl.dot(b_q, tl.trans(b_k)) * qk_scale                          # [BM, BN] fp32
    b_s = tl.where(m_n[None, :], b_s, float("-inf"))                      # padding keys get no weight
    b_m = tl.max(b_s, axis=1)
    b_p = tl.exp2(b_s - b_m[:, None])
    b_l = tl.sum(b_p, axis=1)
    b_o = tl.dot(b_p.to(b_v.dtype), b_v) / b_l[:, None]                   # [BM, BD] fp32
    p_om = p_o + ((i_b * T + o_m[:, None]).to(tl.int64) * H + i_h) * D + o_d[None, :]
    tl.store(p_om, b_o.to(p_o.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])


def attention_tile_fwd(q, k, v, out, softmax_scale: float) -> None:
    """out = softmax(q k^T * scale) v; q, out: contiguous [B, T, H, D]; k, v:
    contiguous [B, S, H, D]."""
    B, T, H, D = q.shape
    S = k.shape[1]
    BN, BD = pow2_at_least_16(S), pow2_at_least_16(D)
    launch(_attention_tile_kernel, lambda bm, bn: (triton.cdiv(T, bm), B * H), tile_candidates(BN),
           ("primer.attention_tile", q.device, q.dtype, D, BN),
           q, k, v, out, T, S, H, softmax_scale * LOG2E, D=D, BD=BD)
