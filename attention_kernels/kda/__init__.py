"""Kimi Delta Attention (Kimi Linear, 2025): the gated delta rule with a decay per key channel.

    naive_recurrent_kda   PyTorch loop over time (the reference); torch_kda_step, one step in PyTorch
    fused_recurrent_kda   one Triton kernel, state in registers; T = 1 is the decode step
    chunk_kda             chunk-parallel prefill: a WY/UT solve per chunk, then GLA's inter-chunk pass;
                          trains (its backward: attention_kernels/kda/chunk_backward.py)
"""
from .interface import chunk_kda, fused_recurrent_kda
from .reference import l2_normalize, naive_recurrent_kda, torch_kda_step

__all__ = ["naive_recurrent_kda", "fused_recurrent_kda", "chunk_kda", "torch_kda_step", "l2_normalize"]
