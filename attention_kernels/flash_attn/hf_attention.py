"""`flash_attn_func` in transformers' attention call, for its AttentionInterface.

transformers lets a model's attention be any function registered under a name in its AttentionInterface:

    >>> transformers.AttentionInterface.register("book", book_attention)
    >>> model = transformers.LlamaForCausalLM(config)      # config.attn_implementation = "book"

The book's package does not need transformers: this module imports nothing of it.
"""
from __future__ import annotations

from .interface import flash_attn_func


def book_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention call: q [B, Hq, T, D], k and v [B, Hkv, S, D] (the cache's keys included),
    returning ([B, T, Hq, D], no probabilities). flash_attn_func's layout is [B, T, H, D] and its causal
    mask bottom-right aligned, which is the decoder's mask for T new queries after S - T cached keys. A
    padding mask is refused: register transformers' flash-attention mask function under the same name
    (masking_utils.AttentionMaskInterface), which returns None unless some token is padding."""
    if attention_mask is not None:
        raise ValueError("book_attention takes unpadded batches: the attention mask must be None")
    causal = kwargs.get("is_causal", module.is_causal)
    o = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), dropout, scaling, causal)
    return o, None


__all__ = ["book_attention"]
