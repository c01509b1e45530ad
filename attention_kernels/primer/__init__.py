"""The Triton primer: a vector add, a row softmax and one attention tile, with their PyTorch forms."""
from .interface import attention_tile, softmax_rows, vector_add
from .reference import add_ref, attention_tile_ref, softmax_naive, softmax_ref

__all__ = ["vector_add", "softmax_rows", "attention_tile", "add_ref", "softmax_naive", "softmax_ref",
           "attention_tile_ref"]
