"""DeepSeek MLA: the absorption trick in PyTorch, a split-KV Triton decode kernel, a hand-scheduled
Hopper decode kernel in Gluon, and the same decode in TileLang (needs TileLang, imported lazily).
Every decode entry takes FlashMLA's argument order: q, kv_cache, block_table, cache_seqlens, head_dim_v,
softmax_scale, causal.

    >>> from attention_kernels.mla import mla_decode, mla_naive, mla_absorbed, mla_decode_ref
"""
from .interface import mla_decode, mla_decode_gluon, mla_decode_tilelang
from .reference import (absorb_query, latent_cache, mla_absorbed, mla_decode_ref, mla_naive, unabsorb_output,
                        yarn_softmax_scale)

__all__ = ["mla_decode", "mla_decode_gluon", "mla_decode_tilelang", "mla_naive", "mla_absorbed", "mla_decode_ref",
           "absorb_query", "latent_cache", "unabsorb_output", "yarn_softmax_scale"]
