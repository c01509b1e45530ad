"""Every family side by side: published model shapes with the bytes their caches and states hold
(`models`, computed, no GPU), the hybrid-stack model built from per-layer times (`models.stack_time`),
and one benchmark declaration for the whole comparison (`bench`: decode against context, prefill and
training, each family at a real model's layer shape).

    >>> from attention_kernels.compare import MODELS, shapes_table
    >>> shapes_table()                   # bytes per token and per sequence, one row per model
    >>> memory_crossovers()              # one layer of each kind: where a cache passes a fixed state
"""
from .models import (LAYERS, MODELS, Layer, Model, kv_cache_bytes_per_token, layer_memory, linear_state_bytes,
                     mamba2_state_bytes, memory_crossovers, mla_cache_bytes_per_token, shapes_table, stack_bytes,
                     stack_time)

__all__ = ["LAYERS", "MODELS", "Layer", "Model", "kv_cache_bytes_per_token", "layer_memory", "linear_state_bytes",
           "mamba2_state_bytes", "memory_crossovers", "mla_cache_bytes_per_token", "shapes_table", "stack_bytes",
           "stack_time"]
