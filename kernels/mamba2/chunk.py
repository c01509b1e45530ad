"""The SSD chunk scan (Dao & Gu 2024): Mamba-2's prefill on the shared chunk machinery.

Mamba-2 is linear attention with a scalar gate per head and token: with the log decay a_t = dt_t·A
(<= 0), k_t = B_t (per group), v_t = x_t·dt_t and q_t = C_t, the step h_t = e^{a_t} h_{t-1} + v_t k_tᵀ,
y_t = h_t q_t is the book's recurrence S_t = e^{g_t} S_{t-1} + k_t v_tᵀ with S = hᵀ ([dstate, headdim]
= [K, V]). So the pieces GLA and Lightning share do the work between chunks:

    chunk_local_cumsum(a as [Bt, T, H, 1])          b, the in-chunk cumulative log decay (G = 1)
    chunk_state_pass(B per head, x·dt, b)           the state at every chunk start, and the final one

and one kernel of Mamba-2's own assembles the output of every chunk at once, in the SSD form:

    Y = diag(e^{b}) C S_start  +  (L ∘ C Bᵀ) X  +  D ⊙ x,    then  Y ⊙ silu(z)
    L_ts = e^{b_t - b_s} for s <= t (the 1-semiseparable mask, exp of a segment sum), else 0

C Bᵀ is formed in place over dstate in tiles (one tensor-core product per tile, never stored), L is
an elementwise mask, and (L ∘ C Bᵀ) X is a second product: the intra-chunk part is the quadratic,
attention-like form, the inter-chunk part the linear one. C and B are read per group, as GQA reads
its shared keys; only the state pass, which takes per-head keys, gets B expanded to the heads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..launch import autotune_configs
from ..linear.chunk import CHUNK, chunk_local_cumsum, chunk_state_pass, dot_precision, output_tile, tiles_that_fit
from ..tl_helpers import dot_causal

# (BK over dstate, BV over headdim), num_warps, num_stages. Not yet tuned on the H200.
_CONFIGS = autotune_configs([({"BK": 64, "BV": 64}, 4, 3), ({"BK": 64, "BV": 64}, 4, 2),
                             ({"BK": 64, "BV": 32}, 4, 3), ({"BK": 128, "BV": 64}, 8, 3)],
                            interpreter={"BK": 32, "BV": 32})


_fits = tiles_that_fit("N", "P")  # dstate and headdim


@triton.autotune(configs=_CONFIGS, key=["N", "P", "HAS_D", "HAS_Z"], prune_configs_by={"early_config_prune": _fits})
@triton.jit(do_not_specialize=["T", "H", "NT", "HPG", "G"])
def _ssd_output_kernel(
    C, B, v, x, b, h, D, z, y, T, H, NT, HPG, G,
    N: tl.constexpr, P: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, DOT_PREC: tl.constexpr,
):
    # one program: the BT rows of chunk i_t, headdim columns [i_v·BV, (i_v+1)·BV), of one (batch, head)
    i_b, i_h, o_c, o_t, m_t, o_v, m_v, p_hc = output_tile(h, T, H, NT, N, P, BT, BV)
    i_g = i_h // HPG                                     # the head's group: its B and C
    b_b = tl.load(b + (i_b * T + o_t) * H + i_h, mask=m_t, other=0.0)   # [BT] cumulative log decay

    # C S_start and C Bᵀ, both over dstate in tiles of BK: [BT, BV] and [BT, BT]
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    b_S = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(N, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < N
        p_g = ((i_b * T + o_t[:, None]) * G + i_g) * N + o_k[None, :]
        b_c = tl.load(C + p_g, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_k = tl.load(B + p_g, mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_h = tl.load(p_hc + o_k[:, None] * P + o_v[None, :], mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_o += tl.dot(b_c, b_h.to(b_c.dtype), input_precision=DOT_PREC)
        b_S += tl.dot(b_c, tl.trans(b_k), input_precision=DOT_PREC)

    # inter-chunk: diag(e^{b_t}) (C S_start): one decay per row, from the chunk start to token t
    b_o = b_o * tl.exp(b_b)[:, None]

    # intra-chunk: (L ∘ C Bᵀ) X with L_ts = e^{b_t - b_s} on and below the diagonal; the select
    # (not a factor 0) keeps the pairs s > t out, whatever their exponent or a later token's values
    m_lo = o_c[:, None] >= o_c[None, :]
    b_L = tl.exp(tl.minimum(b_b[:, None] - b_b[None, :], 0.0))
    b_S = tl.where(m_lo, b_S * b_L, 0.0)
    p_v = ((i_b * T + o_t[:, None]) * H + i_h) * P + o_v[None, :]
    m_ov = m_t[:, None] & m_v[None, :]
    b_v = tl.load(v + p_v, mask=m_ov, other=0.0)
    b_o = dot_causal(b_S.to(b_v.dtype), b_v, b_o, DOT_PREC)

    # the skip D ⊙ x and the gate silu(z), on the fp32 accumulator
    if HAS_D:
        b_x = tl.load(x + p_v, mask=m_ov, other=0.0).to(tl.float32)
        b_o += b_x * tl.load(D + i_h * P + o_v, mask=m_v, other=0.0).to(tl.float32)[None, :]
    if HAS_Z:
        b_z = tl.load(z + p_v, mask=m_ov, other=0.0).to(tl.float32)
        b_o = b_o * b_z * tl.sigmoid(b_z)
    tl.store(y + p_v, b_o.to(y.dtype.element_ty), mask=m_ov)


def ssd_output(C, B, v, x, b, states, D, z, y) -> None:
    """Y = diag(e^b) C S_start + (L ∘ C Bᵀ) V (+ D ⊙ x, ⊙ silu(z)) for every chunk, all chunks in
    parallel: one program per headdim tile, chunk and batch·head.

    C, B: [Bt, T, G, N]; v (x·dt), x, z: [Bt, T, H, P]; b: fp32 [Bt, T, H, 1] (`chunk_local_cumsum`
    of dt·A); states: [Bt, NT, H, N, P] (`chunk_state_pass`); D: [H, P] or None. Written: y
    [Bt, T, H, P]. All contiguous."""
    Bt, T, H, P = v.shape
    G, N = C.shape[2], C.shape[3]
    NT = triton.cdiv(T, CHUNK)
    _ssd_output_kernel[lambda m: (triton.cdiv(P, m["BV"]), NT, Bt * H)](
        C, B, v, x, b, states, D, z, y, T, H, NT, H // G, G, N, P, BT=CHUNK,
        HAS_D=D is not None, HAS_Z=z is not None, DOT_PREC=dot_precision(v.dtype))


def ssd_chunk_scan_fwd(dims, x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states, return_final_states):
    """The scan on checked inputs (interface.ssd_chunk_scan): returns (y, final_states or None)."""
    Bt, T, H, P, N, G = dims
    x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
    z = None if z is None else z.contiguous()
    # dt in fp32: bias, softplus; the log decay a = dt·A per head and token, as a [Bt, T, H, 1] gate
    dtf = dt.float() + (0.0 if dt_bias is None else dt_bias.float())
    if dt_softplus:
        dtf = F.softplus(dtf)
    g = (dtf * A.float()).unsqueeze(-1).contiguous()
    b = torch.empty_like(g)
    chunk_local_cumsum(g, b)
    v = (x.float() * dtf.unsqueeze(-1)).to(x.dtype)                      # X = x·dt, the values
    k = B if G == H else B.repeat_interleave(H // G, dim=2)               # per-head keys for the state pass
    states = torch.empty(Bt, triton.cdiv(T, CHUNK), H, N, P, dtype=x.dtype, device=x.device)
    # the book's state is [K, V] = [dstate, headdim], mamba_ssm's [headdim, dstate]: transposed here
    # once per prompt (the decode step reads mamba_ssm's layout directly)
    h0 = None if initial_states is None else initial_states.transpose(-1, -2).contiguous()
    ht = torch.empty(Bt, H, N, P, dtype=torch.float32, device=x.device) if return_final_states else None
    chunk_state_pass(k, v, b, states, h0, ht)
    Dhp = None if D is None else (D if D.dim() == 2 else D[:, None].expand(H, P)).float().contiguous()
    y = torch.empty_like(x)
    ssd_output(C, B, v, x, b, states, Dhp, z, y)
    return y, (None if ht is None else ht.transpose(-1, -2).contiguous())


__all__ = ["ssd_output", "ssd_chunk_scan_fwd"]
