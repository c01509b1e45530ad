"""Lightning Attention's public entry points: validate the inputs, allocate what is returned and the
chunk buffers, launch. The launch functions in the kernel files take contiguous tensors and decide nothing.

Every entry point has the same arguments and returns (o, final_state):
q, k: [B, T, H, K]; v: [B, T, H, V] (sequence-major, as in fla); slopes: [H], the decay rate of each
head, s_h >= 0 (the decay per step is λ_h = exp(-s_h); 0 means no decay, +inf a full reset at every
step; the values are not checked, which would wait for the GPU); q, k, v one dtype (fp16, bf16 on a
GPU, fp32), slopes any of them (used in fp32); K, V <= 256, any T >= 1. scale defaults to 1.0 (Lightning has no 1/√d;
None also means 1.0). initial_state: fp32 [B, H, K, V] or None (zeros).
o: [B, T, H, V] in v's dtype; final_state: fp32 [B, H, K, V] when output_final_state, else None.
Packed sequences (both forms): cu_seqlens, int32 [N + 1] offsets of N sequences concatenated along T in one
batch row (B = 1); the states are then [N, H, K, V], one per sequence (attention_kernels/linear/packed.py: the
chunk form's kernels, forward and backward, read the chunk table themselves; the recurrent form runs once per
sequence).
fused_recurrent_lightning also serves: a pool of states, each batch row's slot, the state updated in place
(inplace_final_state, ssm_state_indices: attention_kernels/linear/slots.py).
chunk_lightning trains (gradients to q, k, v and initial_state, through o and the final state; the slopes
are fixed per head and take none); the recurrent form has no backward and refuses an input that requires grad.
A NaN or inf in an input never reaches an earlier token's output; an inf that the math carries on as
±inf comes out as ±inf from the recurrent forms and as NaN from the chunk form (telling the signs
apart inside its products would cost registers the kernel does not have).
"""
from __future__ import annotations

import torch

from ..custom_ops import compiled_as_op, gradients_like, like, linear_attention_fake
from ..linear.autograd import chunk_function
from ..linear.chunk import CHUNK, chunk_state_dtype, chunk_state_pass, n_chunks
from ..linear.chunk_backward import chunk_dqk, chunk_dv, chunk_state_grad_pass
from ..checks import check_no_grad
from ..linear.inputs import check_linear_inputs, check_output_gradients
from ..linear.packed import forward_per_sequence, packed_chunks
from ..linear.slots import check_serving_options, pooled_state, step_outputs
from .chunk import chunk_lightning_output
from .fused_recurrent import fused_recurrent_fwd


def _checked(q, k, v, slopes, scale, initial_state, output_final_state, cu_seqlens=None):
    """Validate (the shared checks, the machine rule included); return the sizes, the scale, and the
    tensors made contiguous, slopes in fp32 (a copy only where one is needed)."""
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"slopes": (slopes, "H")}, 1.0 if scale is None else scale,
                                               initial_state, output_final_state, cu_seqlens=cu_seqlens)
    h0 = None if initial_state is None else initial_state.contiguous()
    s = slopes.to(torch.float32).contiguous()
    return (B, T, H, K, V), scale, (q.contiguous(), k.contiguous(), v.contiguous(), s, h0)


@compiled_as_op("attention_kernels::fused_recurrent_lightning", fake=linear_attention_fake, tuple_size=2)
def _fused_recurrent_lightning(q, k, v, slopes, scale=1.0, initial_state=None, output_final_state=False,
                               cu_seqlens=None, ssm_state_indices=None):
    """`fused_recurrent_lightning` in the kernels' own terms (the op torch.compile sees)."""
    return _fused_recurrent_checked(q, k, v, slopes, scale, initial_state, output_final_state, cu_seqlens,
                                    ssm_state_indices, inplace=False)


@compiled_as_op("attention_kernels::fused_recurrent_lightning_inplace", fake=like("v"), mutates_args=("initial_state",))
def _fused_recurrent_lightning_inplace(q, k, v, slopes, initial_state, scale=1.0, ssm_state_indices=None):
    """`fused_recurrent_lightning` with inplace_final_state: returns o, initial_state holds the final states
    (the op torch.compile sees: one that mutates returns one tensor)."""
    o, _ = _fused_recurrent_checked(q, k, v, slopes, scale, initial_state, False, None, ssm_state_indices,
                                    inplace=True)
    return o


def _fused_recurrent_checked(q, k, v, slopes, scale, initial_state, output_final_state, cu_seqlens,
                             ssm_state_indices, inplace):
    # a pool of states is checked apart: its first dim is the number of slots, not B
    pool = ssm_state_indices is not None
    (_, _, H, K, V), scale, (q, k, v, s, h0) = _checked(q, k, v, slopes, scale, None if pool else initial_state,
                                                        output_final_state, cu_seqlens)
    h0, ssm_state_indices = pooled_state("fused_recurrent_lightning", q, initial_state, inplace, ssm_state_indices, h0, H, K, V)
    check_no_grad("fused_recurrent_lightning", q=q, k=k, v=v, slopes=slopes, initial_state=h0)
    if cu_seqlens is None:
        return _fused_recurrent(q, k, v, s, scale, h0, output_final_state, ssm_state_indices, inplace)
    return forward_per_sequence(lambda rows, h0_n, final: _fused_recurrent(*rows, s, scale, h0_n, final),
                                (q, k, v), v, h0, output_final_state, cu_seqlens)


def _fused_recurrent(q, k, v, s, scale, h0, output_final_state, slots=None, inplace=False):
    o, ht = step_outputs(q, v, h0, output_final_state, inplace)
    fused_recurrent_fwd(q, k, v, s, o, scale, h0, ht, slots, final_at_slots=inplace)
    return o, ht


def fused_recurrent_lightning(q, k, v, slopes, scale=1.0, initial_state=None, output_final_state=False,
                              cu_seqlens=None, *, inplace_final_state=False, ssm_state_indices=None):
    """Fused recurrent Lightning Attention forward (Triton): one kernel walks
    the tokens with the state in registers; with T = 1 it is the decode step
    (one read and one write of the state).

    Shapes and dtypes as in this module's docstring; math and state in fp32
    (no `tl.dot`: fp32 inputs are fp32-accurate on every machine). Serving
    (attention_kernels/linear/slots.py, fla's names): ssm_state_indices (int
    [B]) reads each row's initial state from its slot of initial_state, a
    pool [S, H, K, V]; inplace_final_state=True writes the final states back
    where they were read and returns initial_state as the final state.

        >>> q, k, v = torch.randn(3, 1, 1, 32, 128, device="cuda").unbind(0)
        >>> S, s = torch.zeros(1, 32, 128, 128,
        ...                    device="cuda"), lightning_slopes(32).cuda()
        >>> o, S = fused_recurrent_lightning(q, k, v, s, initial_state=S,
        ...                                  output_final_state=True)
        >>> o, S = fused_recurrent_lightning(q, k, v, s, initial_state=S,
        ...                                  inplace_final_state=True)
        ...     # S updated
    """
    if check_serving_options("fused_recurrent_lightning", inplace_final_state, ssm_state_indices, cu_seqlens):
        return (_fused_recurrent_lightning_inplace(q, k, v, slopes, initial_state, scale, ssm_state_indices),
                initial_state)
    return _fused_recurrent_lightning(q, k, v, slopes, scale, initial_state, output_final_state, cu_seqlens,
                                      ssm_state_indices)


fused_recurrent_lightning.op = _fused_recurrent_lightning.op   # its op, as every other public function's


# The forward and backward launchers are ops (as FlashAttention's are): torch.compile traces
# ChunkLightningFunction itself, so a compiled graph's forward and backward are eager's.
@compiled_as_op("attention_kernels::chunk_lightning_fwd", fake=linear_attention_fake, tuple_size=2)
def _chunk_lightning_fwd(q, k, v, gamma, scale, h0: torch.Tensor | None, output_final_state: bool,
                         cu_seqlens: torch.Tensor | None = None):
    """The forward over a batch or over packed sequences (the kernels read the chunk table); returns (o,
    final_state or None). Its inputs are checked again (a lookup for a call the public function has checked):
    the op is reachable on its own (torch.ops.attention_kernels.chunk_lightning_fwd)."""
    _, scale, (q, k, v, gamma, h0) = _checked(q, k, v, gamma, scale, h0, output_final_state, cu_seqlens)
    return _forward(q, k, v, gamma, scale, h0, output_final_state, packed_chunks(cu_seqlens, q.shape[1]))


def _forward(q, k, v, gamma, scale, h0, output_final_state, packed=None):
    """The forward's two launches. packed: packed sequences (`packed_chunks`, B = 1), one state and one final
    state per sequence."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    N = B if packed is None else packed.n_sequences
    states = torch.empty(B, n_chunks(T, packed), H, K, V, dtype=q.dtype, device=q.device)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=q.device) if output_final_state else None
    chunk_state_pass(k, v, None, states, h0, ht, gamma=gamma, packed=packed)
    o = torch.empty_like(v)
    chunk_lightning_output(q, k, v, states, gamma, o, scale, packed=packed)
    return o, ht


@compiled_as_op("attention_kernels::chunk_lightning_bwd", fake=gradients_like("q", "k", "v", "h0"), tuple_size=4)
def _chunk_lightning_bwd(q, k, v, gamma, scale, h0: torch.Tensor | None, do, dht: torch.Tensor | None,
                         cu_seqlens: torch.Tensor | None = None):
    """The backward's launches, the shared ones with the fixed decay gamma: recompute the chunk-start
    states, then the reverse state pass, dv (the scores recomputed inside), dq and dk. do: o's gradient,
    dht: the final state's (or None). Returns (dq, dk, dv, dh0 or None)."""
    (_, T, _, K, _), scale, (q, k, v, _, h0) = _checked(q, k, v, gamma, scale, h0, False, cu_seqlens)
    check_output_gradients(do, dht, v, K, cu_seqlens)
    return _backward(q, k, v, gamma, scale, h0, do, dht, packed_chunks(cu_seqlens, T))


def _backward(q, k, v, gamma, scale, h0, do, dht, packed=None):
    """The backward's launches; the per-chunk states and their gradients in `chunk_state_dtype`. packed: packed
    sequences (`packed_chunks`, B = 1), one initial state and one final state's gradient per sequence."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    states = torch.empty(B, n_chunks(T, packed), H, K, V, dtype=chunk_state_dtype(q.dtype), device=q.device)
    chunk_state_pass(k, v, None, states, h0, gamma=gamma, packed=packed)
    dstates = torch.empty_like(states)
    dh0 = None if h0 is None else torch.empty_like(h0)
    chunk_state_grad_pass(q, do, None, dstates, scale, dht, dh0, gamma=gamma, packed=packed)
    dv, dA = torch.empty_like(v), torch.empty(B, T, H, CHUNK, dtype=torch.float32, device=q.device)
    chunk_dv(q, k, v, None, None, dstates, do, dv, dA, scale, gamma=gamma, packed=packed)
    dq, dk = torch.empty_like(q), torch.empty_like(k)
    chunk_dqk(q, k, v, None, None, states, dstates, do, dA, dq, dk, None, scale, gamma=gamma, packed=packed)
    return dq, dk, dv, dh0


ChunkLightningFunction = chunk_function("ChunkLightningFunction", _chunk_lightning_fwd, _chunk_lightning_bwd)


def chunk_lightning(q, k, v, slopes, scale=1.0, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunk-parallel Lightning Attention-2 (Triton, blocks of 64 tokens):
    the prefill, and training.

    Shapes and dtypes as in this module's docstring. Two launches: the shared
    state pass (the state at every chunk start, sequential over chunks, with
    the decay λ_h^n computed in the kernel), then Lightning's output kernel
    (intra-block (Q K^T ⊙ M) V and inter-block (Q ⊙ λ^(c+1)) kv_prev, all
    chunks in parallel). The carried state is fp32; the per-chunk state
    snapshots are in the input dtype (they feed tensor-core products). fp32
    inputs multiply in IEEE fp32 (`tl.dot` with input_precision="ieee"), so
    they are fp32-accurate on the GPU too.

    Differentiable in q, k, v and initial_state, through o and the final
    state (the backward in attention_kernels/linear/chunk_backward.py saves
    only the inputs). The slopes are fixed per head: a slopes tensor that
    requires grad is refused.

        >>> q, k, v = torch.randn(3, 1, 4096, 32, 128, device="cuda",
        ...                       dtype=torch.bfloat16).unbind(0)
        >>> o, _ = chunk_lightning(q, k, v,
        ...                        lightning_slopes(32, layer_idx=0,
        ...                                         num_layers=80).cuda())
        >>> o.shape              # torch.Size([1, 4096, 32, 128])
    """
    _, scale, (q, k, v, s, h0) = _checked(q, k, v, slopes, scale, initial_state, output_final_state, cu_seqlens)
    if torch.is_grad_enabled() and slopes.requires_grad:
        raise ValueError("slopes requires grad, but chunk_lightning's decay is fixed per head: it has no "
                         "gradient (pass slopes.detach())")
    gamma = -s                                   # the log decay per step, the same for every token
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, h0)):
        return ChunkLightningFunction.apply(q, k, v, gamma, scale, h0, output_final_state, cu_seqlens)
    return _chunk_lightning_fwd(q, k, v, gamma, scale, h0, output_final_state, cu_seqlens)
