"""chunk_kda's backward. It saves nothing from the forward: the forward's own launches
(`chunk_kda_intermediates`, attention_kernels/kda/chunk.py) recompute the in-chunk cumulative gates b, the two score
matrices, the solve's W and W' and the keys decayed to their chunk's end K_g, and the state S at every chunk
start (in `chunk_state_dtype`, the input dtype for 16-bit inputs, as are the state gradients). The forward of
one chunk (attention_kernels/kda/chunk.py has the derivation):

    U = W' - W S,                         W = (I + A)⁻¹ diag(β) (K ⊙ e^b),  W' = (I + A)⁻¹ diag(β) V
    S_next = e^{b_last} ⊙ S + K_gᵀ U,     K_g = K ⊙ e^{b_last - b}
    O = scale (Q ⊙ e^b) S + A_qk U

The reverse state pass is the shared one with its delta-rule switch (attention_kernels/linear/chunk_backward.py,
Triton): from the last chunk to the first, dU = A_qkᵀ dO + K_g dS_next and
dS = scale (Q ⊙ e^b)ᵀ dO + e^{b_last} ⊙ dS_next - Wᵀ dU.

The scores' gradients go through the exponent b_t - b_j of every pair j <= t per channel: both matrices
are GLA's per-channel-gated scores A_tj = Σ_c a_tc k_jc e^{b_tc - b_jc}, with a = q (A_qk, scale folded in
its gradient) and a = k (A_kk, under β, strictly below the diagonal), so their pairs j < t go to GLA's own
sub-chunk launch (`chunk_dqk_intra`, attention_kernels/linear/chunk_backward.py: sub-chunks of 16 rows,
every exponent <= 0), once per matrix; the pair j = t (A_qk's diagonal) has no exponent. They take q and
k in fp32 (as the L2 norm's gradient needs them), in products of IEEE fp32 for fp32 inputs and TF32 for
16-bit ones (more bits than the inputs had).

The rest is PyTorch ops, batched over all chunks, in fp32 on per-chunk tensors [B, H, NT, C, K or V],
[B, H, NT, C, C] and the states [B, H, NT, K, V] (the states and their gradients read as stored, 16-bit for
16-bit inputs, then multiplied in fp32): the read-out's and the state update's gradients; the solve's, as
one more triangular solve with each chunk's own (I + A)ᵀ (dR = (I + A)⁻ᵀ dW, never an explicit inverse),
dA = -dR_k Wᵀ - dR_v W'ᵀ below the diagonal; the scores' gradients dA_qk and dA_kk themselves; then the
in-chunk reverse cumulative sum for g, and the L2 norm's gradient. A gate below GATE_FLOOR (-inf: a reset)
counts as the floor, as in the forward, and gets gradient 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..launch import cdiv
from ..linear.chunk import CHUNK, GATE_FLOOR, chunk_state_dtype, dot_precision
from ..linear.chunk_backward import chunk_dqk_intra, chunk_state_grad_pass
from .chunk import chunk_kda_intermediates
from .reference import L2NORM_EPS


def _to_chunks(x: torch.Tensor, NT: int) -> torch.Tensor:
    """[B, T, H, D] -> fp32 [B, H, NT, C, D], zero rows after T."""
    B, T, H, D = x.shape
    x = F.pad(x.float(), (0, 0, 0, 0, 0, NT * CHUNK - T))
    return x.view(B, NT, CHUNK, H, D).permute(0, 3, 1, 2, 4)


def _from_chunks(x: torch.Tensor, T: int, like: torch.Tensor) -> torch.Tensor:
    """fp32 [B, H, NT, C, D] -> [B, T, H, D] in like's dtype, contiguous."""
    B, H, NT, C, D = x.shape
    return x.permute(0, 2, 3, 1, 4).reshape(B, NT * C, H, D)[:, :T].to(like.dtype).contiguous()


def _l2_normalize_bwd(x: torch.Tensor, x_normed: torch.Tensor, rnorm: torch.Tensor, dx_normed: torch.Tensor):
    """The gradient through x / sqrt(Σ x² + eps): (dx̂ - x̂ (x̂ · dx̂)) / sqrt(Σ x² + eps)."""
    return (dx_normed - x_normed * (x_normed * dx_normed).sum(-1, keepdim=True)) * rnorm


def chunk_kda_bwd(q, k, v, g, beta, scale: float, h0, do, dht, use_qk_l2norm_in_kernel: bool):
    """The gradients of chunk_kda (see the module docstring): Triton for the recomputed forward, the
    reverse state pass and the scores' pairs j < t, PyTorch ops on the per-chunk tensors for the rest.

    q, k, g: [B, T, H, K]; v, do: [B, T, H, V] (do in v's dtype); beta: [B, T, H]; h0, dht: fp32
    [B, H, K, V] or None (zeros); all contiguous. do and dht are the gradients of o and of the final state.
    Returns (dq, dk, dv, dg, dbeta, dh0 or None), each in its input's dtype (dh0 fp32).

        >>> q, k, v, g = torch.randn(4, 1, 70, 2, 32, device="cuda").unbind(0)
        >>> beta = torch.rand(1, 70, 2, device="cuda")
        >>> dq, dk, dv, dg, dbeta, _ = chunk_kda_bwd(q, k, v, -g.abs(), beta, 32 ** -0.5, None,
        ...                                          torch.randn_like(v), None, True)
    """
    B, T, H, K = q.shape
    V, NT, C = v.shape[-1], cdiv(T, CHUNK), CHUNK
    qf, kf = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        rq = torch.rsqrt(qf.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)
        rk = torch.rsqrt(kf.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)
        qn, kn = qf * rq, kf * rk
    else:
        qn, kn = qf, kf
    # ---- the forward's intermediates, by the forward's kernels
    dev, state_dtype = q.device, chunk_state_dtype(q.dtype)
    x = chunk_kda_intermediates(q, k, v, g, beta, scale, h0, l2norm=use_qk_l2norm_in_kernel,
                                state_dtype=state_dtype)
    # ---- the reverse state pass (the delta rule's): dS' at every chunk's end, dS at the start, and dU
    dstates = torch.empty(B, NT, H, K, V, dtype=state_dtype, device=dev)
    dU = torch.empty(B, T, H, V, dtype=torch.float32, device=dev)
    dh0 = None if h0 is None else torch.empty_like(h0)
    chunk_state_grad_pass(x.q, do, x.b, dstates, scale, dht, dh0, Aqk=x.Aqk, kg=x.kg, w=x.w, du=dU)

    # ---- the rest per chunk in PyTorch: [B, H, NT, C, ...] fp32
    qc, kc, vc, doc = (_to_chunks(t, NT) for t in (qn, kn, v, do))
    betac = _to_chunks(beta.unsqueeze(-1), NT)                    # [B, H, NT, C, 1]
    # gates below GATE_FLOOR (-inf) count as the floor, as in the forward's gate pass, and get gradient 0
    b = _to_chunks(g.float().clamp(min=GATE_FLOOR), NT).cumsum(-2)   # the padded rows repeat the last b
    b_last = b[..., -1, :]                                       # [B, H, NT, K]
    causal = torch.ones(C, C, dtype=torch.bool, device=dev).tril()
    strict = causal.tril(-1)
    Akk = torch.where(strict, _to_chunks(x.Akk, NT), 0.0)          # the entries above were never written
    solve = torch.eye(C, device=dev) + betac * Akk                # I + A, unit lower triangular
    kb = kc * b.exp()
    W, Wv, kg, U, dU = (_to_chunks(t, NT) for t in (x.w, x.u, x.kg, x.v_new, dU))
    states, dstates = x.states.float().transpose(1, 2), dstates.float().transpose(1, 2)   # [B, H, NT, K, V]
    qb = qc * b.exp()

    # ---- per chunk: the read-out, the state update, the solve, the scores (their pairs j < t by Triton)
    dqb = scale * doc @ states.transpose(-1, -2)                  # through (Q ⊙ e^b) S
    dq = dqb * b.exp()
    db = dqb * qb
    dkg = U @ dstates.transpose(-1, -2)                            # through K_gᵀ U
    dk = dkg * torch.exp(b_last[..., None, :] - b)
    db = db - dkg * kg
    db_last = (dkg * kg).sum(-2) + b_last.exp() * (states * dstates).sum(-1)
    dR_k = torch.linalg.solve_triangular(solve.transpose(-1, -2), -dU @ states.transpose(-1, -2), upper=True,
                                         unitriangular=True)    # (I + A)⁻ᵀ dW
    dR_v = torch.linalg.solve_triangular(solve.transpose(-1, -2), dU, upper=True, unitriangular=True)
    dA = -(dR_k @ W.transpose(-1, -2) + dR_v @ Wv.transpose(-1, -2)) * strict
    dbeta = (dA * Akk).sum(-1, keepdim=True) + (dR_k * kb).sum(-1, keepdim=True) + (dR_v * vc).sum(-1, keepdim=True)
    dv = betac * dR_v
    dkb = betac * dR_k
    dk = dk + dkb * b.exp()
    db = db + dkb * kb
    # the scores Σ_c a_tc k_jc e^{b_tc - b_jc}: a = q (A_qk, with scale) and a = k (A_kk, under β). Their pairs
    # j < t by GLA's sub-chunk kernel, once per matrix, on [B, T, H, ·] tensors. The pair j = t (A_qk's
    # diagonal; A_kk has none) has no exponent: dA_tt k_t to dq, dA_tt q_t to dk, and to b two shares that
    # cancel exactly, left out
    dAqk = (doc @ U.transpose(-1, -2)) * causal * scale
    dAkk = dA * betac
    # fp32 q and k (ptxas, sm_90a, K = 128: 98 registers at TF32, 102 at IEEE, no spills; 96 for GLA's bf16)
    precision = dot_precision(q.dtype)
    dq_s, dk_cols_q, dk_rows, dk_cols_k = (torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
                                           for _ in range(4))
    chunk_dqk_intra(qn, kn, x.b, _from_chunks(dAqk, T, dAqk), dq_s, dk_cols_q, input_precision=precision)
    chunk_dqk_intra(kn, kn, x.b, _from_chunks(dAkk, T, dAkk), dk_rows, dk_cols_k, input_precision=precision)
    dq_s, dk_rows = _to_chunks(dq_s, NT), _to_chunks(dk_rows, NT)
    dk_cols = _to_chunks(dk_cols_q, NT) + _to_chunks(dk_cols_k, NT)
    dAqk_diag = dAqk.diagonal(dim1=-2, dim2=-1).unsqueeze(-1)      # [B, H, NT, C, 1]
    dq = dq + dq_s + dAqk_diag * kc
    dk = dk + dk_rows + dk_cols + dAqk_diag * qc
    db = db + dq_s * qc + (dk_rows - dk_cols) * kc
    db[..., -1, :] += db_last                                     # b_last is the last (maybe padded) row's b
    dg = db.flip(-2).cumsum(-2).flip(-2)                          # b = the in-chunk cumsum of g

    dq, dk = _from_chunks(dq, T, qf), _from_chunks(dk, T, kf)
    if use_qk_l2norm_in_kernel:
        dq, dk = _l2_normalize_bwd(qf, qn, rq, dq), _l2_normalize_bwd(kf, kn, rk, dk)
    dg = torch.where(g < GATE_FLOOR, 0.0, _from_chunks(dg, T, g))
    return (dq.to(q.dtype), dk.to(k.dtype), _from_chunks(dv, T, v), dg,
            _from_chunks(dbeta, T, beta).squeeze(-1), dh0)


__all__ = ["chunk_kda_bwd"]
