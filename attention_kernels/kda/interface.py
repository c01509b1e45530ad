"""KDA's public entry points: validate the inputs, allocate what is returned and the chunk buffers,
launch. The launch functions in the kernel files take contiguous tensors and decide nothing.

Every entry point has fla's arguments and returns (o, final_state):
q, k, g: [B, T, H, K]; v: [B, T, H, V] (sequence-major, as in fla); beta: [B, T, H]. g = log of the
per-channel decay, <= 0 (-inf clears a channel); beta in [0, 1], the write strength (neither is
checked: that would wait for the GPU). q, k, v one dtype (fp16, bf16 on a GPU, fp32), g and beta any
of them; K, V <= 256, any T >= 1. scale defaults to K ** -0.5. initial_state: fp32 [B, H, K, V] or
None (zeros). use_qk_l2norm_in_kernel: divide q and k by their L2 norm first (the model's keys must
be normalised for the delta rule to stay a contraction; pass False if they already are).
o: [B, T, H, V] in v's dtype; final_state: fp32 [B, H, K, V] when output_final_state, else None.
Packed sequences (both forms): cu_seqlens, int32 [N + 1] offsets of N sequences concatenated along T in one
batch row (B = 1); the states are then [N, H, K, V], one per sequence (attention_kernels/linear/packed.py: the
chunk form's kernels, forward and backward, read the chunk table themselves; the recurrent form runs once per
sequence).
fused_recurrent_kda also serves: a pool of states, each batch row's slot, the state updated in place
(inplace_final_state, ssm_state_indices: attention_kernels/linear/slots.py).
chunk_kda trains (gradients to q, k, v, g, beta and initial_state, through o and the final state, and
through the L2 norm when it is on); fused_recurrent_kda has no backward and refuses an input that
requires grad.
Both also take fla's call (fla.ops.kda) as Kimi Linear's layer makes it: fla's names, positions and
defaults; the gate options use_gate_in_kernel (g the raw gate projection, with A_log [H] and dt_bias
[H * K]; lower_bound for the bounded gate), use_beta_sigmoid_in_kernel (beta the logits) and
allow_neg_eigval (beta in [0, 2)), done in PyTorch before the kernels (attention_kernels/kda/gate.py);
state_v_first (the state kept as [B, H, V, K]); safe_gate, fla's promise that the gate stays in
[lower_bound, 0) (these kernels are exact without it, so it changes nothing here); and fla's options
for what these kernels do not do (disable_recompute, return_intermediate_states, cu_seqlens_cpu,
cp_context, a chunk_size other than 64) at their defaults only (ValueError naming them).
A NaN or inf in an input never reaches an earlier token's output; where the loop of the reference
gives ±inf (an inf in v with K = 1), the recurrent form gives the same and the chunk form NaN, at and
after that token (telling the signs apart inside its products would cost registers it does not have).
"""
from __future__ import annotations

import torch

from ..checks import check_bool, check_no_grad, check_tensor
from ..custom_ops import compiled_as_op, gradients_like, like, linear_attention_fake
from ..linear.chunk import CHUNK, chunk_output
from ..linear.inputs import check_linear_inputs, check_output_gradients, state_v_first_in, state_v_first_out
from ..linear.packed import forward_per_sequence, packed_chunks
from ..linear.slots import check_serving_options, pooled_state, step_outputs
from .chunk import chunk_kda_intermediates
from .chunk_backward import chunk_kda_bwd
from .fused_recurrent import fused_recurrent_fwd
from .gate import check_gate_options, kda_beta, kda_gate


def _checked(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
             cu_seqlens=None):
    """Validate (the shared checks, the machine rule included); return the sizes, the scale, and the
    tensors made contiguous (a copy only where one is not)."""
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {"g": (g, "B T H K"), "beta": (beta, "B T H")}, scale,
                                               initial_state, output_final_state, cu_seqlens=cu_seqlens)
    check_bool("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    h0 = None if initial_state is None else initial_state.contiguous()
    return (B, T, H, K, V), scale, (q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(),
                                    beta.contiguous(), h0)


def _gate_and_beta(form, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                   allow_neg_eigval, lower_bound, safe_gate=False, no_grad_form=False):
    """fla's gate options checked and applied (attention_kernels/kda/gate.py): the log decay and the write strength
    the kernels take, autograd ops of g, beta, A_log and dt_bias where the options ask for them. With
    no_grad_form (a form without backward), any of these four that requires grad is refused."""
    check_gate_options(form, g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                       allow_neg_eigval, lower_bound, safe_gate)
    if no_grad_form:
        check_no_grad(form, g=g, beta=beta, A_log=A_log, dt_bias=dt_bias)
    if use_gate_in_kernel:
        g = kda_gate(g, A_log, dt_bias, lower_bound)
    if use_beta_sigmoid_in_kernel:
        beta = kda_beta(beta, allow_neg_eigval)
    return g, beta


@compiled_as_op("attention_kernels::fused_recurrent_kda", fake=linear_attention_fake, tuple_size=2)
def _fused_recurrent_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, cu_seqlens=None, ssm_state_indices=None):
    """`fused_recurrent_kda` in the kernels' own terms (the op torch.compile sees)."""
    return _fused_recurrent_checked(q, k, v, g, beta, scale, initial_state, output_final_state,
                                    use_qk_l2norm_in_kernel, cu_seqlens, ssm_state_indices, inplace=False)


@compiled_as_op("attention_kernels::fused_recurrent_kda_inplace", fake=like("v"), mutates_args=("initial_state",))
def _fused_recurrent_kda_inplace(q, k, v, g, beta, initial_state, scale=None, use_qk_l2norm_in_kernel=False,
                                 ssm_state_indices=None):
    """`fused_recurrent_kda` with inplace_final_state: returns o, initial_state holds the final states (the
    op torch.compile sees: one that mutates returns one tensor)."""
    o, _ = _fused_recurrent_checked(q, k, v, g, beta, scale, initial_state, False, use_qk_l2norm_in_kernel, None,
                                    ssm_state_indices, inplace=True)
    return o


def _fused_recurrent_checked(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                             cu_seqlens, ssm_state_indices, inplace):
    # a pool of states is checked apart: its first dim is the number of slots, not B
    pool = ssm_state_indices is not None
    (_, _, H, K, V), scale, (q, k, v, g, beta, h0) = _checked(q, k, v, g, beta, scale,
                                                              None if pool else initial_state, output_final_state,
                                                              use_qk_l2norm_in_kernel, cu_seqlens)
    h0, ssm_state_indices = pooled_state("fused_recurrent_kda", q, initial_state, inplace, ssm_state_indices, h0, H, K, V)
    check_no_grad("fused_recurrent_kda", q=q, k=k, v=v, g=g, beta=beta, initial_state=h0)

    def run(rows, h0_n, final, slots=None):
        q, k, v, g, beta = rows
        o, ht = step_outputs(q, v, h0_n, final, inplace)
        fused_recurrent_fwd(q, k, v, g, beta, o, scale, h0_n, ht, slots, final_at_slots=inplace,
                            l2norm=use_qk_l2norm_in_kernel)
        return o, ht

    if cu_seqlens is None:
        return run((q, k, v, g, beta), h0, output_final_state, ssm_state_indices)
    return forward_per_sequence(run, (q, k, v, g, beta), v, h0, output_final_state, cu_seqlens)


def fused_recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, lower_bound=None,
                        state_v_first=False, cu_seqlens=None, *, inplace_final_state=False, ssm_state_indices=None):
    """Fused recurrent KDA forward (Triton): one kernel walks the tokens with
    the state in registers; with T = 1 it is the decode step (one read and
    one write of the state, q and k normalised in registers when asked).

    Shapes and dtypes as in this module's docstring; math and state in fp32
    (no `tl.dot`: fp32 inputs are fp32-accurate on every machine). fla's
    arguments in fla's order (A_log and dt_bias sixth and seventh, as there):
    with use_gate_in_kernel, g is the raw gate and the log decay -exp(A_log)
    * softplus(g + dt_bias) (lower_bound * sigmoid(exp(A_log) * (g +
    dt_bias)) with lower_bound set); with use_beta_sigmoid_in_kernel, beta is
    the logits (sigmoid, times 2 with allow_neg_eigval). Both are computed in
    PyTorch before the launch (attention_kernels/kda/gate.py): fusing them
    into the kernel is a later speed step. state_v_first=True takes
    initial_state as [B, H, V, K] and returns the final state so (a
    transposed view of the kernel's [B, H, K, V] one). Serving
    (attention_kernels/linear/slots.py, the names of fla's
    fused_recurrent_kda_fwd): ssm_state_indices (int [B]) reads each row's
    initial state from its slot of initial_state, a pool [S, H, K, V];
    inplace_final_state=True writes the final states back where they were
    read and returns initial_state as the final state (fla's own default
    there is True; here, as in fla's fused_recurrent_kda, False).

        >>> q, k, v, g = torch.randn(4, 1, 1, 32, 128,
        ...                          device="cuda").unbind(0)
        >>> beta = torch.rand(1, 1, 32, device="cuda")
        >>> S = torch.zeros(1, 32, 128, 128, device="cuda")
        >>> o, S = fused_recurrent_kda(q, k, v, -g.abs(), beta,
        ...                            initial_state=S,
        ...                            output_final_state=True,
        ...                            use_qk_l2norm_in_kernel=True)
    """
    g, beta = _gate_and_beta("fused_recurrent_kda", g, beta, A_log, dt_bias, use_gate_in_kernel,
                             use_beta_sigmoid_in_kernel, allow_neg_eigval, lower_bound, no_grad_form=True)
    if check_serving_options("fused_recurrent_kda", inplace_final_state, ssm_state_indices, cu_seqlens,
                             state_v_first):
        return _fused_recurrent_kda_inplace(q, k, v, g, beta, initial_state, scale, use_qk_l2norm_in_kernel,
                                            ssm_state_indices), initial_state
    initial_state = state_v_first_in(initial_state, state_v_first, q, v, cu_seqlens)
    o, ht = _fused_recurrent_kda(q, k, v, g, beta, scale, initial_state, output_final_state,
                                 use_qk_l2norm_in_kernel, cu_seqlens, ssm_state_indices)
    return o, state_v_first_out(ht, state_v_first)


fused_recurrent_kda.op = _fused_recurrent_kda.op   # its op, as every other public function's


# The forward and backward launchers are ops (as chunk_gla's are): torch.compile traces ChunkKDAFunction
# itself, so a compiled graph's forward and backward are eager's, each launcher one node.
@compiled_as_op("attention_kernels::chunk_kda_fwd", fake=linear_attention_fake, tuple_size=2)
def _chunk_kda_fwd(q, k, v, g, beta, scale, h0: torch.Tensor | None, output_final_state: bool,
                   use_qk_l2norm_in_kernel: bool, cu_seqlens: torch.Tensor | None = None):
    """The forward, over a batch or packed sequences; returns (o, final_state or None). Its inputs are checked
    again, by the op's names (a lookup for a call the public function has checked): the op is reachable on its
    own (torch.ops.attention_kernels.chunk_kda_fwd)."""
    _, scale, (q, k, v, g, beta, h0) = _checked(q, k, v, g, beta, scale, h0, output_final_state,
                                                use_qk_l2norm_in_kernel, cu_seqlens)
    return _forward(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                    packed=packed_chunks(cu_seqlens, q.shape[1]))


def _keeping_scores_fake(q, v, output_final_state, cu_seqlens=None, **_):
    """The training forward's outputs: the forward's (o, final state or None) with the query-key scores and
    the solve's inverse between them."""
    o, ht = linear_attention_fake(q=q, v=v, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return o, q.new_empty((*q.shape[:3], CHUNK)), q.new_empty((*q.shape[:3], CHUNK)), ht


@compiled_as_op("attention_kernels::chunk_kda_fwd_keeping_scores", fake=_keeping_scores_fake, tuple_size=4)
def _chunk_kda_fwd_keeping_scores(q, k, v, g, beta, scale, h0: torch.Tensor | None, output_final_state: bool,
                                  use_qk_l2norm_in_kernel: bool, cu_seqlens: torch.Tensor | None = None):
    """The training forward (ChunkKDAFunction's): `_chunk_kda_fwd`, and it returns the query-key scores and
    the solve's inverse X = (I + A)⁻¹ too, (o, Aqk, X, final_state or None), both [B, T, H, CHUNK] in q's dtype,
    for the backward to take instead of launching the scores and the solve again, as fla's chunk_kda keeps its
    own two. Kept rather than recomputed: 4 bytes a token, head and chunk position for 16-bit inputs (8 for
    fp32; q's size at K = 128, bf16). Recomputed, the backward's score launches took about a twentieth of the
    step's GPU time (0.78 of 13.8 ms at B 1, 16K, 32 heads; notes/TUNING.md 2026-12-07 (37)) and its solve ran
    in the launch that recomputes W and Ũ (0.87 ms a launch there, half of the forward's and the backward's
    1.74, against 0.43 for fla's `recompute_w_u` without a solve)."""
    (B, T, H, _, _), scale, (q, k, v, g, beta, h0) = _checked(q, k, v, g, beta, scale, h0, output_final_state,
                                                              use_qk_l2norm_in_kernel, cu_seqlens)
    # the blocks above the diagonal stay unwritten; each packed sequence's rows hold its own chunks (they start
    # at its first token)
    Aqk, inverse = (torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=q.device) for _ in range(2))
    o, ht = _forward(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, kept=(Aqk, inverse),
                     packed=packed_chunks(cu_seqlens, T))
    return o, Aqk, inverse, ht


def _forward(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, kept=None, packed=None):
    """The forward's six launches over a batch or over packed sequences (`packed_chunks`); kept: (Aqk, X)
    buffers the query-key scores and the solve's inverse are written into (the training forward's), or None
    for buffers dropped after it."""
    x = chunk_kda_intermediates(q, k, v, g, beta, scale, h0, l2norm=use_qk_l2norm_in_kernel, state_dtype=q.dtype,
                                output_final_state=output_final_state, kept=kept, packed=packed)
    o = torch.empty_like(v)
    chunk_output(x.q, x.v_new, x.b, x.states, x.Aqk, o, scale, packed=packed)
    return o, x.final_state


@compiled_as_op("attention_kernels::chunk_kda_bwd", fake=gradients_like("q", "k", "v", "g", "beta", "h0"), tuple_size=6)
def _chunk_kda_bwd(q, k, v, g, beta, scale, h0: torch.Tensor | None, do, dht: torch.Tensor | None,
                   use_qk_l2norm_in_kernel: bool, cu_seqlens: torch.Tensor | None = None,
                   Aqk: torch.Tensor | None = None, inverse: torch.Tensor | None = None):
    """The backward (attention_kernels/kda/chunk_backward.py), over a batch or packed sequences: recompute the gates,
    W and Ũ and the chunk-start states (and the scores and the solve unless given), the delta rule's reverse
    state pass, then every gradient. do: o's gradient, dht: the final state's (or None); Aqk, inverse: the
    forward's scores and solve's inverse (`_chunk_kda_fwd_keeping_scores`), both or neither. Returns (dq, dk,
    dv, dg, dbeta, dh0 or None)."""
    (B, T, H, K, _), scale, (q, k, v, g, beta, h0) = _checked(q, k, v, g, beta, scale, h0, False,
                                                              use_qk_l2norm_in_kernel, cu_seqlens)
    check_output_gradients(do, dht, v, K, cu_seqlens)
    if (Aqk is None) != (inverse is None):
        raise ValueError("chunk_kda's backward takes the forward's Aqk and inverse together, or neither")
    kept = None
    if Aqk is not None:
        # each packed sequence's rows of the kept two are its own (every sequence's chunks start at its first token)
        kept = (check_tensor("Aqk", Aqk, dtypes=(q.dtype,), shape=(B, T, H, CHUNK)).contiguous(),
                check_tensor("inverse", inverse, dtypes=(q.dtype,), shape=(B, T, H, CHUNK)).contiguous())
    return chunk_kda_bwd(q, k, v, g, beta, scale, h0, do, dht, use_qk_l2norm_in_kernel, kept=kept,
                         packed=packed_chunks(cu_seqlens, T))


class ChunkKDAFunction(torch.autograd.Function):
    """Forward: `_chunk_kda_fwd_keeping_scores`, saving the inputs, the query-key scores and the solve's
    inverse. Backward: `_chunk_kda_bwd`, which takes those two and recomputes the rest."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
        o, Aqk, inverse, ht = _chunk_kda_fwd_keeping_scores(q, k, v, g, beta, scale, h0, output_final_state,
                                                            use_qk_l2norm_in_kernel, cu_seqlens)
        ctx.save_for_backward(q, k, v, g, beta, h0, cu_seqlens, Aqk, inverse)
        ctx.scale, ctx.l2norm = scale, use_qk_l2norm_in_kernel
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, g, beta, h0, cu_seqlens, Aqk, inverse = ctx.saved_tensors
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        dht = None if dht is None else dht.to(torch.float32).contiguous()
        dq, dk, dv, dg, dbeta, dh0 = _chunk_kda_bwd(q, k, v, g, beta, ctx.scale, h0, do, dht, ctx.l2norm,
                                                    cu_seqlens, Aqk, inverse)
        return dq, dk, dv, dg, dbeta, None, dh0, None, None, None


def _refuse_fla_options(disable_recompute, return_intermediate_states, cu_seqlens_cpu, cp_context,
                        chunk_size) -> None:
    """fla's chunk_kda options for what these kernels do not do: accepted at their defaults, refused naming
    them."""
    if check_bool("disable_recompute", disable_recompute):
        raise ValueError("disable_recompute must be False: chunk_kda's backward recomputes all but the query-key "
                         "scores and the solve's inverse from the inputs")
    if check_bool("return_intermediate_states", return_intermediate_states):
        raise ValueError("return_intermediate_states must be False: chunk_kda returns (o, final_state) only")
    if cu_seqlens_cpu is not None:
        raise ValueError("cu_seqlens_cpu must be None: chunk_kda reads the offsets from cu_seqlens alone")
    if cp_context is not None:
        raise ValueError("cp_context must be None: chunk_kda runs on one device (no context parallelism)")
    if chunk_size != 64:
        raise ValueError(f"chunk_size must be 64, the chunk these kernels are written for, got {chunk_size!r}")


def chunk_kda(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
              allow_neg_eigval=False, safe_gate=False, lower_bound=None, disable_recompute=False,
              return_intermediate_states=False, state_v_first=False, cu_seqlens=None, cu_seqlens_cpu=None,
              cp_context=None, *, A_log=None, dt_bias=None, chunk_size=64):
    """Chunk-parallel KDA (Triton, chunks of 64 tokens): the prefill, and
    training.

    Shapes and dtypes as in this module's docstring. Six launches: one pass
    over the inputs (the shared gate pass: the in-chunk cumulative gates, q
    and k normalised when asked); the two score matrices of every chunk,
    query-key and key-key together (the blocks below the diagonal, then the
    diagonal blocks token by token); the triangular solve for the
    pseudo-values, which also decays each chunk's keys to its end; the shared
    state pass with the delta rule (sequential over chunks); the output
    (GLA's, with the corrected values for v). The gates, the key-key scores,
    the solve and the carried state are fp32; the per-chunk states,
    pseudo-values and query-key scores are in the input dtype (they feed
    tensor-core products).

    Differentiable in q, k, v, g, beta and initial_state, through o and the
    final state (and the L2 norm when it is on). The backward keeps the
    inputs, the query-key scores and the solve's inverse (4 bytes a token,
    head and chunk position for 16-bit inputs, kept only when a gradient is
    needed, as fla keeps its own two): the forward's kernels recompute the
    rest with no scores launch and no solve, the shared reverse state pass
    runs with its delta-rule switch, the scores' pairs j < t go
    to GLA's sub-chunk kernel (both score matrices in one launch), and two
    kernels of KDA's own do the rest, one program per chunk: before it the
    read-out's, the state update's and the solve's gradients (the last as
    products with the kept inverse), after it the sums, dβ, the gate's
    in-chunk reverse cumulative sum and the L2 norm's gradient
    (attention_kernels/kda/chunk_backward.py). A gate below GATE_FLOOR
    (-inf) gets gradient 0.

    fla's arguments in fla's order, A_log and dt_bias by keyword (fla reads
    them from its **kwargs). With use_gate_in_kernel, g is the raw gate
    projection and the log decay -exp(A_log) * softplus(g + dt_bias) (A_log
    [H], dt_bias [H * K]; lower_bound * sigmoid(exp(A_log) * (g + dt_bias))
    with lower_bound set); with use_beta_sigmoid_in_kernel, beta is the
    logits (sigmoid, times 2 with allow_neg_eigval). Both are PyTorch ops
    before the kernels (attention_kernels/kda/gate.py), so the backward
    reaches A_log, dt_bias, the raw gate and the logits through autograd;
    fusing them into the first kernel is a later speed step. safe_gate is
    fla's promise that the gate stays in [lower_bound, 0), for a faster
    kernel of its own: checked as fla checks it, and changing nothing here.
    state_v_first=True takes initial_state as [B, H, V, K] and returns the
    final state so (a transposed view; gradients flow through it).

        >>> q, k, v, g = torch.randn(4, 1, 4096, 32, 128, device="cuda",
        ...                          dtype=torch.bfloat16).unbind(0)
        >>> g = (torch.nn.functional.logsigmoid(g.float())
        ...      / 16).requires_grad_()
        >>> beta = torch.rand(1, 4096, 32, device="cuda")
        >>> o, _ = chunk_kda(q, k, v, g, beta,
        ...     use_qk_l2norm_in_kernel=True); o.sum().backward()
    """
    _refuse_fla_options(disable_recompute, return_intermediate_states, cu_seqlens_cpu, cp_context, chunk_size)
    g, beta = _gate_and_beta("chunk_kda", g, beta, A_log, dt_bias, use_gate_in_kernel, use_beta_sigmoid_in_kernel,
                             allow_neg_eigval, lower_bound, safe_gate)
    initial_state = state_v_first_in(initial_state, state_v_first, q, v, cu_seqlens)
    _, scale, (q, k, v, g, beta, h0) = _checked(q, k, v, g, beta, scale, initial_state, output_final_state,
                                                use_qk_l2norm_in_kernel, cu_seqlens)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, g, beta, h0)):
        o, ht = ChunkKDAFunction.apply(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                                       cu_seqlens)
    else:
        o, ht = _chunk_kda_fwd(q, k, v, g, beta, scale, h0, output_final_state, use_qk_l2norm_in_kernel,
                               cu_seqlens)
    return o, state_v_first_out(ht, state_v_first)
