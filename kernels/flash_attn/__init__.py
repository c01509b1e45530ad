"""FlashAttention-2 in Triton: GQA-aware forward and backward, and its plain-PyTorch reference.

    >>> from kernels.flash_attn import flash_attn_func, attention_ref
    >>> o = flash_attn_func(q, k, v, causal=True)      # q [B, T, Hq, D], k/v [B, S, Hkv, D]
"""
from .interface import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, flash_attn_func
from .reference import attention_eager, attention_ref, causal_mask

__all__ = ["flash_attn_func", "attention_ref", "attention_eager", "causal_mask",
           "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES"]
