"""What the linear-attention families (GLA, Lightning, KDA, Mamba-2) share, as fla's ops/common is shared by
its families: the input check, the chunk machinery (the in-chunk cumulative gates, the inter-chunk state pass,
the output assembly) around each family's own scores, the autograd Function of a chunk form (`autograd`), the pieces and the launch of a fused decode step
(`recurrent`), and what the benchmarks count (`costs`). Each family takes the parts it needs.

    >>> from attention_kernels.linear import CHUNK, check_linear_inputs, chunk_local_cumsum, chunk_state_pass, chunk_output
"""
from .chunk import (CHUNK, GATE_FLOOR, chunk_local_cumsum, chunk_output, chunk_state_dtype, chunk_state_pass,
                    dot_precision)
from .inputs import MAX_HEAD_DIM, check_linear_inputs

__all__ = ["CHUNK", "GATE_FLOOR", "MAX_HEAD_DIM", "check_linear_inputs", "chunk_local_cumsum", "chunk_state_pass",
           "chunk_output", "chunk_state_dtype", "dot_precision"]
