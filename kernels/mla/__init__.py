"""DeepSeek MLA: the absorption trick in PyTorch, and a split-KV Triton decode kernel.

    >>> from kernels.mla import mla_decode, mla_naive, mla_absorbed, mla_decode_ref
"""
from .decode import mla_decode
from .reference import (absorb_query, latent_cache, mla_absorbed, mla_decode_ref, mla_naive, unabsorb_output,
                        yarn_softmax_scale)

__all__ = ["mla_decode", "mla_naive", "mla_absorbed", "mla_decode_ref", "absorb_query", "latent_cache",
           "unabsorb_output", "yarn_softmax_scale"]
