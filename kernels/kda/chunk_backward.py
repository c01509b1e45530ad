"""chunk_kda's backward, in PyTorch ops over all chunks at once (batched matmuls; the two walks over
chunks are loops of one matmul pair per chunk). No Triton kernel yet: this is the correct reference
the kernels will be checked against, and it runs wherever the forward runs.

It saves nothing from the forward. From the inputs it recomputes, per chunk of C = 64 tokens and in
fp32: the in-chunk cumulative gates b, the two score matrices, the solve's W and W' (as products with
the chunk's own (I + A)⁻¹, a unit lower-triangular solve, never an explicit inverse) and the state S at
every chunk start. The forward of one chunk (kernels/kda/chunk.py has the derivation):

    U = W' - W S,                         W = (I + A)⁻¹ diag(β) (K ⊙ e^b),  W' = (I + A)⁻¹ diag(β) V
    S_next = e^{b_last} ⊙ S + K_gᵀ U,     K_g = K ⊙ e^{b_last - b}
    O = scale (Q ⊙ e^b) S + A_qk U

The reverse state pass carries dS from the last chunk to the first (the delta rule's transition:
dS = scale (Q ⊙ e^b)ᵀ dO + e^{b_last} ⊙ dS_next - Wᵀ dU, with dU = A_qkᵀ dO + K_g dS_next). The solve's
gradient is one more triangular solve with the transpose, dR = (I + A)⁻ᵀ dW, and dA = -dR_k Wᵀ - dR_v W'ᵀ
below the diagonal. The scores' gradients use the exponent b_t - b_j of every pair (j <= t) per channel:
a [C, C, K] tensor per chunk (the memory cost of this path). A gate below GATE_FLOOR (-inf: a reset)
counts as the floor, as in the forward, and gets gradient 0.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..launch import cdiv
from ..linear.chunk import CHUNK, GATE_FLOOR
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


def chunk_kda_bwd_torch(q, k, v, g, beta, scale: float, h0, do, dht, use_qk_l2norm_in_kernel: bool):
    """The gradients of chunk_kda, computed with PyTorch ops on the recomputed per-chunk tensors.

    q, k, g: [B, T, H, K]; v, do: [B, T, H, V]; beta: [B, T, H]; h0, dht: fp32 [B, H, K, V] or None
    (zeros). do and dht are the gradients of o and of the final state. Math in fp32.
    Returns (dq, dk, dv, dg, dbeta, dh0 or None), each in its input's dtype (dh0 fp32).

        >>> q, k, v, g = torch.randn(4, 1, 70, 2, 32).unbind(0); beta = torch.rand(1, 70, 2)
        >>> dq, dk, dv, dg, dbeta, _ = chunk_kda_bwd_torch(q, k, v, -g.abs(), beta, 32 ** -0.5, None,
        ...                                                torch.randn_like(v), None, True)
    """
    B, T, H, K = q.shape
    NT, C = cdiv(T, CHUNK), CHUNK
    qf, kf = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        rq = torch.rsqrt(qf.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)
        rk = torch.rsqrt(kf.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)
        qn, kn = qf * rq, kf * rk
    else:
        qn, kn = qf, kf
    qc, kc, vc, doc = (_to_chunks(x, NT) for x in (qn, kn, v, do))
    betac = _to_chunks(beta.unsqueeze(-1), NT)                    # [B, H, NT, C, 1]
    # gates below GATE_FLOOR (-inf) count as the floor, as in the forward's gate pass, and get gradient 0
    b = _to_chunks(g.float().clamp(min=GATE_FLOOR), NT).cumsum(-2)   # the padded rows repeat the last b
    b_last = b[..., -1, :]                                       # [B, H, NT, K]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    strict = causal.tril(-1)
    # e^{b_t - b_j} for j <= t, per channel: [B, H, NT, C(t), C(j), K]
    decay = torch.exp(torch.where(causal[:, :, None], b[..., :, None, :] - b[..., None, :, :], float("-inf")))

    # ---- the forward's intermediates
    Akk = torch.einsum("...tc,...jc,...tjc->...tj", kc, kc, decay) * strict
    Aqk = torch.einsum("...tc,...jc,...tjc->...tj", qc, kc, decay) * scale
    solve = torch.eye(C, device=q.device) + betac * Akk           # I + A, unit lower triangular
    kb = kc * b.exp()
    W = torch.linalg.solve_triangular(solve, betac * kb, upper=False, unitriangular=True)
    Wv = torch.linalg.solve_triangular(solve, betac * vc, upper=False, unitriangular=True)
    kg = kc * torch.exp(b_last[..., None, :] - b)
    S = h0.float() if h0 is not None else q.new_zeros(B, H, K, v.shape[-1], dtype=torch.float32)
    states, U = [], []
    for n in range(NT):                                          # the forward state pass
        states.append(S)
        U.append(Wv[:, :, n] - W[:, :, n] @ S)
        S = b_last[:, :, n, :, None].exp() * S + kg[:, :, n].transpose(-1, -2) @ U[n]
    states, U = torch.stack(states, 2), torch.stack(U, 2)

    # ---- the reverse state pass: dS at every chunk's end, and dU
    qb = qc * b.exp()
    dS = dht.float() if dht is not None else torch.zeros_like(S)
    dstates, dU = [None] * NT, [None] * NT
    for n in reversed(range(NT)):
        dstates[n] = dS
        dU[n] = Aqk[:, :, n].transpose(-1, -2) @ doc[:, :, n] + kg[:, :, n] @ dS
        dS = (scale * qb[:, :, n].transpose(-1, -2) @ doc[:, :, n] + b_last[:, :, n, :, None].exp() * dS
              - W[:, :, n].transpose(-1, -2) @ dU[n])
    dh0 = dS if h0 is not None else None
    dstates, dU = torch.stack(dstates, 2), torch.stack(dU, 2)

    # ---- per chunk: the read-out, the state update, the solve, the scores
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
    # the scores Σ_c a_tc k_jc e^{b_tc - b_jc}: a = q (A_qk, with scale) and a = k (A_kk, under β)
    dAqk = (doc @ U.transpose(-1, -2)) * causal * scale
    dAkk = dA * betac
    dq_s = torch.einsum("...tj,...jc,...tjc->...tc", dAqk, kc, decay)
    dk_rows = torch.einsum("...tj,...jc,...tjc->...tc", dAkk, kc, decay)
    dk_cols = (torch.einsum("...tj,...tc,...tjc->...jc", dAqk, qc, decay)
               + torch.einsum("...tj,...tc,...tjc->...jc", dAkk, kc, decay))
    dq = dq + dq_s
    dk = dk + dk_rows + dk_cols
    db = db + dq_s * qc + (dk_rows - dk_cols) * kc
    db[..., -1, :] += db_last                                     # b_last is the last (maybe padded) row's b
    dg = db.flip(-2).cumsum(-2).flip(-2)                          # b = the in-chunk cumsum of g

    dq, dk = _from_chunks(dq, T, qf), _from_chunks(dk, T, kf)
    if use_qk_l2norm_in_kernel:
        dq, dk = _l2_normalize_bwd(qf, qn, rq, dq), _l2_normalize_bwd(kf, kn, rk, dk)
    dg = torch.where(g < GATE_FLOOR, 0.0, _from_chunks(dg, T, g))
    return (dq.to(q.dtype), dk.to(k.dtype), _from_chunks(dv, T, v), dg,
            _from_chunks(dbeta, T, beta).squeeze(-1), dh0)


__all__ = ["chunk_kda_bwd_torch"]
