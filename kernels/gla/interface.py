"""GLA's public entry points: validate the inputs, allocate what is returned and the chunk
buffers, launch. The launch functions in the kernel files take contiguous tensors and decide nothing.

Every entry point has the same arguments and returns (o, final_state):
q, k, gk: [B, T, H, K]; v: [B, T, H, V] (sequence-major, as in fla); gk = log of the
per-channel decay, <= 0, and -inf resets a channel (its value is not checked: that would wait for
the GPU); q, k, v one dtype (fp16, bf16 on a GPU, fp32), gk any of them; K, V <= 256.
scale defaults to K ** -0.5. initial_state: fp32 [B, H, K, V] or None (zeros).
o: [B, T, H, V] in v's dtype; final_state: fp32 [B, H, K, V] when output_final_state, else None.
"""
from __future__ import annotations

import torch
import triton

from ..custom_ops import compiled_as_op, linear_attention_fake
from ..linear.chunk import CHUNK, chunk_local_cumsum, chunk_output, chunk_state_pass
from ..linear.inputs import check_linear_inputs
from .chunk import chunk_gla_scores
from .fused_recurrent import fused_recurrent_fwd
from .sequential_chunk import sequential_chunk_fwd


def _checked(q, k, v, gk, scale, initial_state, output_final_state):
    """Validate (the shared checks, the machine rule included); return the sizes, the scale, and
    the tensors made contiguous (a copy only where one is not)."""
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"gk": (gk, "B T H K")}, scale, initial_state,
                                               output_final_state)
    h0 = None if initial_state is None else initial_state.contiguous()
    return (B, T, H, K, V), scale, (q.contiguous(), k.contiguous(), v.contiguous(), gk.contiguous(), h0)


@compiled_as_op("kernels::fused_recurrent_gla", fake=linear_attention_fake, tuple_size=2)
def fused_recurrent_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """Fused recurrent GLA forward (Triton): one kernel walks the tokens with the state in
    registers; with T = 1 it is the decode step (one read and one write of the state).

    Shapes and dtypes as in this module's docstring; math and state in fp32 (no `tl.dot`: fp32
    inputs are fp32-accurate on every machine).

        >>> q, k, v, gk = torch.randn(4, 1, 1, 32, 128, device="cuda").unbind(0)
        >>> S = torch.zeros(1, 32, 128, 128, device="cuda")
        >>> o, S = fused_recurrent_gla(q, k, v, -gk.abs(), initial_state=S, output_final_state=True)
    """
    (B, T, H, K, V), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, initial_state, output_final_state)
    o = torch.empty_like(v)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    fused_recurrent_fwd(q, k, v, gk, o, scale, h0, ht)
    return o, ht


@compiled_as_op("kernels::sequential_chunk_gla", fake=linear_attention_fake, tuple_size=2)
def sequential_chunk_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """GLA forward the source article's way: one launch per 64-token chunk, tokens in sequence
    inside it, the state handed from launch to launch through HBM (no tensor cores).

    Shapes and dtypes as in this module's docstring; math and state in fp32 (no `tl.dot`).

        >>> q, k, v, gk = torch.randn(4, 1, 256, 4, 64, device="cuda").unbind(0)
        >>> o, S = sequential_chunk_gla(q, k, v, -gk.abs(), output_final_state=True)
        >>> S.shape  # torch.Size([1, 4, 64, 64])
    """
    (B, T, H, K, V), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, initial_state, output_final_state)
    o = torch.empty_like(v)
    # the running state, updated in place launch after launch: the caller's initial_state is copied
    state = (torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device) if h0 is None
             else h0.clone())
    sequential_chunk_fwd(q, k, v, gk, o, state, scale)
    return o, (state if output_final_state else None)


@compiled_as_op("kernels::chunk_gla", fake=linear_attention_fake, tuple_size=2)
def chunk_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """Chunk-parallel GLA forward (Triton, chunks of 64 tokens, sub-chunks of 16): the prefill.

    Shapes and dtypes as in this module's docstring. Four launches: the in-chunk cumulative gates,
    the state at every chunk start, GLA's intra-chunk scores, the output. The gates and the
    carried state are fp32; the per-chunk state snapshots and the scores A are in the input dtype
    (they feed tensor-core products). fp32 inputs multiply in IEEE fp32 (`tl.dot` with
    input_precision="ieee"), so they are fp32-accurate on the GPU too.

        >>> q, k, v, gk = torch.randn(4, 1, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).unbind(0)
        >>> gk = torch.nn.functional.logsigmoid(gk.float()) / 16
        >>> o, _ = chunk_gla(q, k, v, gk)
    """
    (B, T, H, K, V), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, initial_state, output_final_state)
    dev = q.device
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
    chunk_local_cumsum(gk, g)
    states = torch.empty(B, triton.cdiv(T, CHUNK), H, K, V, dtype=q.dtype, device=dev)
    ht = torch.empty(B, H, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    chunk_state_pass(k, v, g, states, h0, ht)
    A = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=dev)   # blocks above the diagonal stay unwritten
    chunk_gla_scores(q, k, g, A, scale)
    o = torch.empty_like(v)
    chunk_output(q, v, g, states, A, o, scale)
    return o, ht
