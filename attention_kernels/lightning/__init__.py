"""Lightning Attention (Qin et al. 2024; MiniMax-01): linear attention with a fixed decay per head.

    naive_recurrent_lightning   PyTorch loop over time (the reference); torch_lightning_step, one step
    lightning_slopes            MiniMax-01's per-layer decay slopes (ALiBi's geometric series, scaled)
    fused_recurrent_lightning   one Triton kernel, state in registers; T = 1 is the decode step
    chunk_lightning             Lightning Attention-2's tiled prefill on tensor cores
    naive_recurrent_elu_linear  the source article's variant, named for what it is (Katharopoulos
                                linear attention with ELU+1), correctly normalised
    minimax_lightning_block     the MiniMax-01 layer around the kernel (SiLU, RMSNorm over heads, gate)
    chunk_lightning_attn        fla's call (layer_idx, num_layers; fla's own slopes, fla_lightning_slopes,
                                and scale 1/√K), on chunk_lightning; fused_recurrent_lightning_attn, the
                                same on fused_recurrent_lightning (compat.py)
"""
from .compat import chunk_lightning_attn, fla_lightning_slopes, fused_recurrent_lightning_attn
from .interface import chunk_lightning, fused_recurrent_lightning
from .reference import (article_lightning_step, elu_feature_map, lightning_slopes, minimax_lightning_block,
                        naive_recurrent_elu_linear, naive_recurrent_lightning, rms_norm, torch_lightning_step)

__all__ = ["naive_recurrent_lightning", "fused_recurrent_lightning", "chunk_lightning", "lightning_slopes",
           "torch_lightning_step", "naive_recurrent_elu_linear", "elu_feature_map", "article_lightning_step",
           "rms_norm", "minimax_lightning_block", "chunk_lightning_attn", "fused_recurrent_lightning_attn",
           "fla_lightning_slopes"]
