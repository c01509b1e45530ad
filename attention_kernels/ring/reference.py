"""Ring attention in plain PyTorch, on one process: the log-sum-exp merge, and the whole ring simulated
rank by rank and step by step, so the schedule can be read (and tested) without torch.distributed.

Every partial result is a pair (o, lse): o [B, T, H, D] is softmax attention over one block of keys,
lse [B, H, T] is the base-2 log-sum-exp of that block's scaled scores, lse = log2 Σ_j 2^(s_ij·scale·log2 e),
the convention of attention_kernels.flash_attn's forward. Two partials over disjoint key sets merge exactly:
    lse = log2(2^lse_a + 2^lse_b),  o = 2^(lse_a - lse) · o_a + 2^(lse_b - lse) · o_b.
"""
from __future__ import annotations

import math

import torch

from ..flash_attn.reference import check_attention_args
from .zigzag import contiguous_split, contiguous_unsplit, ring_plan, zigzag_split, zigzag_unsplit

LOG2E = math.log2(math.e)


def merge_partials(o_a, lse_a, o_b, lse_b):
    """Merge two partial attention results over disjoint key sets into one (exact, in fp32 or wider).

    o_a, o_b: [B, T, H, D]; lse_a, lse_b: [B, H, T], base-2 log-sum-exps (-inf for "no key yet").
    Returns (o, lse) in the dtype of o_a and lse_a. A row with lse_a = -inf takes (o_b, lse_b) as is.

    >>> o, lse = merge_partials(o_a, lse_a, o_b, lse_b)   # = attention over the union of the key sets
    """
    lse = torch.logaddexp2(lse_a, lse_b)
    w_a = torch.exp2(lse_a - lse).transpose(1, 2).unsqueeze(-1)  # [B, T, H, 1]
    w_b = torch.exp2(lse_b - lse).transpose(1, 2).unsqueeze(-1)
    return o_a * w_a + o_b.to(o_a.dtype) * w_b, lse


def merge_into(o, lse, o_b, lse_b) -> None:
    """`merge_partials` in place, for the kernels' ring: o (fp32 [B, T, H, D]) and lse (fp32 [B, H, T]) are
    updated to the merge of themselves with (o_b, lse_b); they may be views (e.g. the back half of the rows).
    One temporary of o's size (the weighted o_b) instead of four."""
    lse_new = torch.logaddexp2(lse, lse_b)
    o.mul_(torch.exp2(lse - lse_new).transpose(1, 2).unsqueeze(-1))
    o.add_(o_b * torch.exp2(lse_b - lse_new).transpose(1, 2).unsqueeze(-1))
    lse.copy_(lse_new)


def block_attention_ref(q, k, v, causal=False, softmax_scale=None):
    """Softmax attention of q over one block of keys, with its base-2 log-sum-exp, in q's dtype (use fp64).

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D]. causal masks j <= i + S - T (only T == S is used by the ring).
    Returns (o [B, T, Hq, D], lse [B, Hq, T]).
    """
    scale = check_attention_args(q, k, v, causal, softmax_scale)
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    if causal:
        T, S = q.shape[1], k.shape[1]
        i = torch.arange(T, device=q.device)[:, None]
        j = torch.arange(S, device=q.device)[None, :]
        s = s.masked_fill(j > i + S - T, float("-inf"))
    lse_e = torch.logsumexp(s, dim=-1)  # [B, H, T], natural log
    o = torch.einsum("bhts,bshd->bthd", torch.exp(s - lse_e[..., None]), v)
    return o, lse_e * LOG2E


def ring_attention_simulated(q, k, v, causal=False, world=2, softmax_scale=None):
    """The ring on one process: split q, k, v over `world` ranks (zig-zag when causal, contiguous
    otherwise), run every rank's steps of `ring_plan` with `block_attention_ref`, merge the partials
    with `merge_partials`, and put the sequence back together.

    q: [B, T, Hq, D]; k, v: [B, T, Hkv, D]; T a multiple of 2·world (causal) or world. Computes in
    q's dtype (pass fp64 for a reference). Returns (o [B, T, Hq, D], lse [B, Hq, T], base 2).

    >>> o, lse = ring_attention_simulated(q.double(), k.double(), v.double(), causal=True, world=4)
    """
    scale = check_attention_args(q, k, v, causal, softmax_scale)
    split, unsplit = (zigzag_split, zigzag_unsplit) if causal else (contiguous_split, contiguous_unsplit)
    qs, ks, vs = ([split(t, r, world) for r in range(world)] for t in (q, k, v))
    outs, lses = [], []
    for rank in range(world):
        B, TL, H, D = qs[rank].shape
        c = TL // 2
        o = torch.zeros_like(qs[rank])
        lse = torch.full((B, H, TL), float("-inf"), dtype=q.dtype, device=q.device)
        for step in range(world):
            plan = ring_plan(rank, step, world, causal)
            q_rows = slice(0, TL) if plan.queries == "all" else slice(c, TL)
            kv_rows = slice(0, TL) if plan.keys == "all" else slice(0, c)
            o_b, lse_b = block_attention_ref(qs[rank][:, q_rows], ks[plan.src][:, kv_rows], vs[plan.src][:, kv_rows],
                                             plan.causal, scale)
            o[:, q_rows], lse[..., q_rows] = merge_partials(o[:, q_rows], lse[..., q_rows], o_b, lse_b)
        outs.append(o)
        lses.append(lse)
    return unsplit(outs), unsplit(lses, dim=2)


__all__ = ["merge_partials", "merge_into", "block_attention_ref", "ring_attention_simulated", "LOG2E"]
