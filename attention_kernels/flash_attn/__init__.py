"""FlashAttention-2 in Triton: GQA-aware forward and backward, dense and on packed sequences, and
their plain-PyTorch references.

    >>> from attention_kernels.flash_attn import flash_attn_func, flash_attn_varlen_func, attention_ref
    >>> o = flash_attn_func(q, k, v, causal=True)      # q [B, T, Hq, D], k/v [B, S, Hkv, D]
    >>> o = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
"""
from .interface import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, flash_attn_func, flash_attn_varlen_func
from .reference import attention_eager, attention_ref, attention_varlen_ref, causal_mask

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "attention_ref", "attention_varlen_ref", "attention_eager",
           "causal_mask", "SUPPORTED_HEAD_DIMS", "SUPPORTED_DTYPES"]
