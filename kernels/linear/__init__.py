"""What the linear-attention families share (GLA now; Lightning, KDA and Mamba-2 next), as fla's
ops/common is shared by its families: the input check, and the chunk machinery (the in-chunk
cumulative gates, the inter-chunk state pass, the output assembly) around each family's own scores.

    >>> from kernels.linear import CHUNK, check_linear_inputs, chunk_local_cumsum, chunk_state_pass, chunk_output
"""
from .chunk import CHUNK, GATE_FLOOR, chunk_local_cumsum, chunk_output, chunk_state_pass, dot_precision
from .inputs import MAX_HEAD_DIM, check_linear_inputs

__all__ = ["CHUNK", "GATE_FLOOR", "MAX_HEAD_DIM", "check_linear_inputs", "chunk_local_cumsum", "chunk_state_pass",
           "chunk_output", "dot_precision"]
