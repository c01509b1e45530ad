"""fla's call on Lightning Attention (fla/ops/lightning_attn), onto the book's kernels.

fla names the layer instead of the decay: `chunk_lightning_attn(q, k, v, layer_idx, num_layers, scale,
initial_state, output_final_state, cu_seqlens, head_first)` and `fused_recurrent_lightning_attn` (the same,
with reverse before cu_seqlens), layout [B, T, H, K] as here, returning (o, final_state). It computes its
own slopes from the layer, s_h = (8 / H) · (1 - layer_idx / num_layers) · h for h = 0 … H-1 (a decay per
step exp(-s_h) that is linear in the head in log space, with no decay on head 0), and its scale defaults to
1/√K. Those are fla's conventions, not MiniMax-01's: MiniMax's slopes are `lightning_slopes` (a geometric
series, scaled by 1 - l / (L - 1)) and its scale is 1. This module reproduces fla's answer; a model ported
from MiniMax's own code calls `chunk_lightning` with `lightning_slopes` instead.
"""
from __future__ import annotations

import torch

from ..checks import check_bool, check_int
from .interface import chunk_lightning, fused_recurrent_lightning


def fla_lightning_slopes(num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """fla's slopes for one layer: s_h = (8 / H) · (1 - layer_idx / num_layers) · h, fp32 [H] on the CPU."""
    H = check_int("num_heads", num_heads, low=1)
    L = check_int("num_layers", num_layers, low=1)
    layer = check_int("layer_idx", layer_idx, low=0)
    return 8.0 / H * (1.0 - layer / L) * torch.arange(H, dtype=torch.float32)


def _book_arguments(q, layer_idx, num_layers, scale, cu_seqlens, head_first):
    """fla's arguments in the kernels' terms: the slopes on q's device, the scale, int32 offsets."""
    if check_bool("head_first", head_first):
        raise ValueError("head_first must be False: the inputs are [B, T, H, K] (fla refuses head_first too)")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a 4-dim tensor [B, T, H, K], got {getattr(q, 'shape', type(q).__name__)}")
    slopes = fla_lightning_slopes(q.shape[2], layer_idx, num_layers).to(q.device)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dtype == torch.int64:     # fla's are int64
        cu_seqlens = cu_seqlens.to(torch.int32)     # a value past 2^31 fails the offsets' check (last = T)
    return slopes, scale, cu_seqlens


def chunk_lightning_attn(q, k, v, layer_idx, num_layers, scale=None, initial_state=None, output_final_state=False,
                         cu_seqlens=None, head_first=False):
    """fla's `chunk_lightning_attn` (same arguments, order and returns) on `chunk_lightning`.

    q, k: [B, T, H, K]; v: [B, T, H, V]; layer_idx >= 0 and num_layers >= 1 give fla's slopes
    (`fla_lightning_slopes`); scale defaults to 1/√K; initial_state fp32 [N, H, K, V]; cu_seqlens int32
    or int64 [N + 1] (batch 1). Returns (o [B, T, H, V], final_state fp32 [N, H, K, V] or None).
    Differentiable in q, k, v and initial_state, as chunk_lightning is.
    """
    slopes, scale, cu_seqlens = _book_arguments(q, layer_idx, num_layers, scale, cu_seqlens, head_first)
    return chunk_lightning(q, k, v, slopes, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens)


def fused_recurrent_lightning_attn(q, k, v, layer_idx, num_layers, scale=None, initial_state=None,
                                   output_final_state=False, reverse=False, cu_seqlens=None, head_first=False):
    """fla's `fused_recurrent_lightning_attn` (same arguments, order and returns) on
    `fused_recurrent_lightning`: as chunk_lightning_attn, forward only; reverse must be False."""
    if check_bool("reverse", reverse):
        raise ValueError("reverse must be False: fused_recurrent_lightning walks the tokens forward only")
    slopes, scale, cu_seqlens = _book_arguments(q, layer_idx, num_layers, scale, cu_seqlens, head_first)
    return fused_recurrent_lightning(q, k, v, slopes, scale=scale, initial_state=initial_state,
                                     output_final_state=output_final_state, cu_seqlens=cu_seqlens)


__all__ = ["chunk_lightning_attn", "fused_recurrent_lightning_attn", "fla_lightning_slopes"]
