"""GLA's public entry points: validate the inputs, allocate what is returned and the chunk
buffers, launch. The launch functions in the kernel files take contiguous tensors and decide nothing.

Every entry point has the same arguments and returns (o, final_state):
q, k, gk: [B, T, H, K]; v: [B, T, H, V] (sequence-major, as in fla); gk = log of the
per-channel decay, <= 0, and -inf resets a channel (its value is not checked: that would wait for
the GPU); q, k, v one dtype (fp16, bf16 on a GPU, fp32), gk any of them; K, V <= 256.
scale defaults to K ** -0.5. initial_state: fp32 [B, H, K, V] or None (zeros).
o: [B, T, H, V] in v's dtype; final_state: fp32 [B, H, K, V] when output_final_state, else None.
Packed sequences (chunk_gla and fused_recurrent_gla): cu_seqlens, int32 [N + 1] offsets of N sequences
concatenated along T in one batch row (B = 1); the states are then [N, H, K, V], one per sequence
(attention_kernels/linear/packed.py: the chunk form's kernels, forward and backward, read the chunk table
themselves; the recurrent form runs once per sequence).
fused_recurrent_gla also serves: a pool of states, each batch row's slot, the state updated in place
(inplace_final_state, ssm_state_indices: attention_kernels/linear/slots.py).
chunk_gla trains (gradients to q, k, v, gk and initial_state, through o and the final state); the other
forms have no backward and refuse an input that requires grad. chunk_gla_tilelang is the chunk form in
TileLang (tilelang_chunk.py): bf16 or fp16, K and V of 64 or 128, CUDA tensors, TileLang installed.

chunk_gla and fused_recurrent_gla also take fla's call (fla.ops.gla) as its model code makes it: its
names and positions (chunk_gla's gate is `g` there), state_v_first (the state kept as [B, H, V, K]), and
its options for what these kernels lack (gv, reverse, cu_seqlens_cpu) at their defaults only.
"""
from __future__ import annotations

import torch

from .. import peers
from . import tilelang_chunk
from ..custom_ops import compiled_as_op, gradients_like, like, linear_attention_fake
from ..linear.autograd import chunk_function
from ..linear.chunk import CHUNK, chunk_local_cumsum, chunk_output, chunk_state_dtype, chunk_state_pass, n_chunks
from ..linear.chunk_backward import chunk_dqk, chunk_dv, chunk_state_grad_pass
from ..checks import check_bool, check_no_grad, check_tensor
from ..linear.inputs import check_linear_inputs, check_output_gradients
from ..linear.inputs import state_v_first_in as _state_in, state_v_first_out as _state_out
from ..linear.packed import forward_per_sequence, packed_chunks
from ..linear.slots import check_serving_options, pooled_state, step_outputs
from .chunk import chunk_gla_scores
from .fused_recurrent import fused_recurrent_fwd
from .sequential_chunk import sequential_chunk_fwd


def _checked(q, k, v, gk, scale, initial_state, output_final_state, cu_seqlens=None, gate_name="gk"):
    """Validate (the shared checks, the machine rule included); return the sizes, the scale, and
    the tensors made contiguous (a copy only where one is not). gate_name: the gate's name in messages."""
    B, T, H, K, V, scale = check_linear_inputs(q, k, v, {gate_name: (gk, "B T H K")}, scale, initial_state,
                                               output_final_state, cu_seqlens=cu_seqlens)
    h0 = None if initial_state is None else initial_state.contiguous()
    return (B, T, H, K, V), scale, (q.contiguous(), k.contiguous(), v.contiguous(), gk.contiguous(), h0)


def _refuse_fla_options(form: str, gv=None, reverse=False, cu_seqlens_cpu=None) -> None:
    """fla's options for what these kernels do not do: accepted at their defaults, refused naming them."""
    if gv is not None:
        raise ValueError(f"gv must be None: {form} decays the state per key channel (gk) only, not per value")
    if check_bool("reverse", reverse):
        raise ValueError(f"reverse must be False: {form} walks the tokens forward only")
    if cu_seqlens_cpu is not None:
        raise ValueError(f"cu_seqlens_cpu must be None: {form} reads the offsets from cu_seqlens alone")


@compiled_as_op("attention_kernels::fused_recurrent_gla", fake=linear_attention_fake, tuple_size=2)
def _fused_recurrent_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
                         ssm_state_indices=None):
    """`fused_recurrent_gla` in the kernels' own terms (the op torch.compile
    sees)."""
    return _fused_recurrent_checked(q, k, v, gk, scale, initial_state, output_final_state, cu_seqlens,
                                    ssm_state_indices, inplace=False)


@compiled_as_op("attention_kernels::fused_recurrent_gla_inplace", fake=like("v"), mutates_args=("initial_state",))
def _fused_recurrent_gla_inplace(q, k, v, gk, initial_state, scale=None, ssm_state_indices=None):
    """`fused_recurrent_gla` with inplace_final_state: returns o, initial_state holds the final states (the
    op torch.compile sees: one that mutates returns one tensor)."""
    o, _ = _fused_recurrent_checked(q, k, v, gk, scale, initial_state, False, None, ssm_state_indices, inplace=True)
    return o


def _fused_recurrent_checked(q, k, v, gk, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices,
                             inplace):
    # a pool of states is checked apart: its first dim is the number of slots, not B
    pool = ssm_state_indices is not None
    (_, _, H, K, V), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, None if pool else initial_state,
                                                         output_final_state, cu_seqlens)
    h0, ssm_state_indices = pooled_state("fused_recurrent_gla", q, initial_state, inplace, ssm_state_indices, h0, H, K, V)
    check_no_grad("fused_recurrent_gla", q=q, k=k, v=v, gk=gk, initial_state=h0)
    if cu_seqlens is None:
        return _fused_recurrent(q, k, v, gk, scale, h0, output_final_state, ssm_state_indices, inplace)
    return forward_per_sequence(lambda rows, h0_n, final: _fused_recurrent(*rows, scale, h0_n, final),
                                (q, k, v, gk), v, h0, output_final_state, cu_seqlens)


def _fused_recurrent(q, k, v, gk, scale, h0, output_final_state, slots=None, inplace=False):
    o, ht = step_outputs(q, v, h0, output_final_state, inplace)
    fused_recurrent_fwd(q, k, v, gk, o, scale, h0, ht, slots, final_at_slots=inplace)
    return o, ht


def fused_recurrent_gla(q, k, v, gk=None, gv=None, scale=None, initial_state=None, output_final_state=False,
                        reverse=False, state_v_first=False, cu_seqlens=None, *, inplace_final_state=False,
                        ssm_state_indices=None):
    """Fused recurrent GLA forward (Triton): one kernel walks the tokens with
    the state in registers; with T = 1 it is the decode step (one read and
    one write of the state).

    Shapes and dtypes as in this module's docstring; math and state in fp32
    (no `tl.dot`: fp32 inputs are fp32-accurate on every machine). fla's
    arguments in fla's order: gk=None is no decay (a gate of zeros);
    state_v_first=True takes initial_state as [B, H, V, K] and returns the
    final state so (a transposed view of the kernel's [B, H, K, V] one).
    Refused unless at their defaults (ValueError naming them): gv (a decay
    per value channel), reverse=True. cu_seqlens: packed sequences. Serving
    (attention_kernels/linear/slots.py, fla's names): ssm_state_indices (int
    [B]) reads each row's initial state from its slot of initial_state, a
    pool [S, H, K, V]; inplace_final_state=True writes the final states back
    where they were read and returns initial_state as the final state.

        >>> q, k, v, gk = torch.randn(4, 1, 1, 32, 128,
        ...                           device="cuda").unbind(0)
        >>> S = torch.zeros(1, 32, 128, 128, device="cuda")
        >>> o, S = fused_recurrent_gla(q, k, v, -gk.abs(), initial_state=S,
        ...                            output_final_state=True)
        >>> pool, slots = torch.zeros(64, 32, 128, 128,
        ...                           device="cuda"), torch.tensor([7],
        ...                               device="cuda")
        >>> o, _ = fused_recurrent_gla(q, k, v, -gk.abs(),
        ...                            initial_state=pool,
        ...                            inplace_final_state=True,
        ...                            ssm_state_indices=slots)
        ...     # pool[7] holds the new state
    """
    _refuse_fla_options("fused_recurrent_gla", gv=gv, reverse=reverse)
    inplace = check_serving_options("fused_recurrent_gla", inplace_final_state, ssm_state_indices, cu_seqlens,
                                    state_v_first)
    if gk is None and isinstance(k, torch.Tensor):
        gk = torch.zeros_like(k)   # log decay 0: the state is kept as it is
    if inplace:
        return _fused_recurrent_gla_inplace(q, k, v, gk, initial_state, scale, ssm_state_indices), initial_state
    initial_state = _state_in(initial_state, state_v_first, q, v, cu_seqlens)
    o, ht = _fused_recurrent_gla(q, k, v, gk, scale, initial_state, output_final_state, cu_seqlens, ssm_state_indices)
    return o, _state_out(ht, state_v_first)


fused_recurrent_gla.op = _fused_recurrent_gla.op   # its op, as every other public function's


@compiled_as_op("attention_kernels::sequential_chunk_gla", fake=linear_attention_fake, tuple_size=2)
def sequential_chunk_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False):
    """GLA forward the source article's way: one launch per 64-token chunk, tokens in sequence
    inside it, the state handed from launch to launch through HBM (no tensor cores).

    Shapes and dtypes as in this module's docstring; math and state in fp32 (no `tl.dot`).

        >>> q, k, v, gk = torch.randn(4, 1, 256, 4, 64, device="cuda").unbind(0)
        >>> o, S = sequential_chunk_gla(q, k, v, -gk.abs(), output_final_state=True)
        >>> S.shape  # torch.Size([1, 4, 64, 64])
    """
    (B, T, H, K, V), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, initial_state, output_final_state)
    check_no_grad("sequential_chunk_gla", q=q, k=k, v=v, gk=gk, initial_state=h0)
    o = torch.empty_like(v)
    # the running state, updated in place launch after launch: the caller's initial_state is copied
    state = (torch.zeros(B, H, K, V, dtype=torch.float32, device=q.device) if h0 is None
             else h0.clone())
    sequential_chunk_fwd(q, k, v, gk, o, state, scale)
    return o, (state if output_final_state else None)


# The forward and backward launchers are ops (as FlashAttention's are): torch.compile traces
# ChunkGLAFunction itself, so a compiled graph's forward and backward are eager's, each launcher one node.
@compiled_as_op("attention_kernels::chunk_gla_fwd", fake=linear_attention_fake, tuple_size=2)
def _chunk_gla_fwd(q, k, v, gk, scale, h0: torch.Tensor | None, output_final_state: bool,
                   cu_seqlens: torch.Tensor | None = None):
    """The forward without a backward to follow (it keeps nothing), over a batch or packed sequences; returns
    (o, final_state or None). Its inputs are checked again, by the op's names (a lookup for a call the public
    function has checked): the op is reachable on its own (torch.ops.attention_kernels.chunk_gla_fwd)."""
    _, scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, h0, output_final_state, cu_seqlens)
    return _forward(q, k, v, gk, scale, h0, output_final_state, packed=packed_chunks(cu_seqlens, q.shape[1]))


def _keeping_scores_fake(q, v, output_final_state, cu_seqlens=None, **_):
    """The training forward's outputs: the forward's (o, final state or None) with the scores between them."""
    o, ht = linear_attention_fake(q=q, v=v, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    return o, q.new_empty((*q.shape[:3], CHUNK)), ht


@compiled_as_op("attention_kernels::chunk_gla_fwd_keeping_scores", fake=_keeping_scores_fake, tuple_size=3)
def _chunk_gla_fwd_keeping_scores(q, k, v, gk, scale, h0: torch.Tensor | None, output_final_state: bool,
                                  cu_seqlens: torch.Tensor | None = None):
    """The training forward (ChunkGLAFunction's): `_chunk_gla_fwd`, and it returns the intra-chunk scores too,
    (o, A, final_state or None) with A [B, T, H, CHUNK] in q's dtype, for the backward to take instead of
    launching the scores kernel again, as fla's chunk_gla keeps its A. Cheaper kept than recomputed: A is
    CHUNK values a token and head (half of q at K = 128), the scores kernel one of the step's longest."""
    (B, T, H, _, _), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, h0, output_final_state, cu_seqlens)
    A = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=q.device)
    # a packed sequence's scores go into its rows: every sequence's chunks start at its first token
    o, ht = _forward(q, k, v, gk, scale, h0, output_final_state, A, packed_chunks(cu_seqlens, T))
    return o, A, ht


def _forward(q, k, v, gk, scale, h0, output_final_state, A=None, packed=None):
    """The forward's four launches; the scores go to A (allocated here when None). packed: packed sequences
    (`packed_chunks`, B = 1), one state and one final state per sequence."""
    B, T, H, K = q.shape
    V, dev = v.shape[-1], q.device
    N = B if packed is None else packed.n_sequences
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
    chunk_local_cumsum(gk, g, packed=packed)
    states = torch.empty(B, n_chunks(T, packed), H, K, V, dtype=q.dtype, device=dev)
    ht = torch.empty(N, H, K, V, dtype=torch.float32, device=dev) if output_final_state else None
    chunk_state_pass(k, v, g, states, h0, ht, packed=packed)
    if A is None:
        A = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=dev)   # blocks above the diagonal stay unwritten
    chunk_gla_scores(q, k, g, A, scale, packed=packed)
    o = torch.empty_like(v)
    chunk_output(q, v, g, states, A, o, scale, packed=packed)
    return o, ht


@compiled_as_op("attention_kernels::chunk_gla_bwd", fake=gradients_like("q", "k", "v", "gk", "h0"), tuple_size=5)
def _chunk_gla_bwd(q, k, v, gk, scale, h0: torch.Tensor | None, do, dht: torch.Tensor | None,
                   cu_seqlens: torch.Tensor | None = None, A: torch.Tensor | None = None):
    """The backward, over a batch or packed sequences. do: o's gradient, dht: the final state's (or None); A:
    the forward's scores (`_chunk_gla_fwd_keeping_scores`), or None to recompute them. Returns (dq, dk, dv,
    dgk, dh0 or None)."""
    (B, T, H, K, _), scale, (q, k, v, gk, h0) = _checked(q, k, v, gk, scale, h0, False, cu_seqlens)
    check_output_gradients(do, dht, v, K, cu_seqlens)
    if A is not None:
        A = check_tensor("A", A, dtypes=(q.dtype,), shape=(B, T, H, CHUNK)).contiguous()
    return _backward(q, k, v, gk, scale, h0, do, dht, A, packed_chunks(cu_seqlens, T))


def _backward(q, k, v, gk, scale, h0, do, dht, A=None, packed=None):
    """The backward's launches: recompute the cumulative gates and the chunk-start states, and the scores
    only where A is None (the training forward keeps its A, as fla's chunk_gla does), then the reverse
    state pass, dv, and dq, dk, dgk. The per-chunk states and their gradients are in
    `chunk_state_dtype` (the input dtype for 16-bit inputs). packed: packed sequences (`packed_chunks`), whose
    kept scores sit in their own rows (every sequence's chunks start at its first token)."""
    B, T, H, K = q.shape
    V, dev = v.shape[-1], q.device
    g = torch.empty(B, T, H, K, dtype=torch.float32, device=dev)
    chunk_local_cumsum(gk, g, packed=packed)   # recomputed, not kept: fp32, as large as q in fp32, cheap to redo
    states = torch.empty(B, n_chunks(T, packed), H, K, V, dtype=chunk_state_dtype(q.dtype), device=dev)
    chunk_state_pass(k, v, g, states, h0, packed=packed)
    if A is None:
        A = torch.empty(B, T, H, CHUNK, dtype=q.dtype, device=dev)
        chunk_gla_scores(q, k, g, A, scale, packed=packed)
    dstates = torch.empty_like(states)
    dh0 = None if h0 is None else torch.empty_like(h0)
    chunk_state_grad_pass(q, do, g, dstates, scale, dht, dh0, packed=packed)
    dv, dA = torch.empty_like(v), torch.empty(B, T, H, CHUNK, dtype=torch.float32, device=dev)
    chunk_dv(q, k, v, g, A, dstates, do, dv, dA, scale, packed=packed)
    dq, dk, dgk = torch.empty_like(q), torch.empty_like(k), torch.empty_like(gk)
    chunk_dqk(q, k, v, gk, g, states, dstates, do, dA, dq, dk, dgk, scale, packed=packed)
    return dq, dk, dv, dgk, dh0


# The forward keeps the scores for the backward only here, where a gradient will be taken.
ChunkGLAFunction = chunk_function("ChunkGLAFunction", _chunk_gla_fwd_keeping_scores, _chunk_gla_bwd, kept=("A",))


def chunk_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, state_v_first=False,
              cu_seqlens=None, cu_seqlens_cpu=None, *, gk=None):
    """Chunk-parallel GLA (Triton, chunks of 64 tokens, sub-chunks of 16):
    the prefill, and training.

    Shapes and dtypes as in this module's docstring. Four launches: the
    in-chunk cumulative gates, the state at every chunk start, GLA's
    intra-chunk scores, the output. The gates and the carried state are fp32;
    the per-chunk state snapshots and the scores A are in the input dtype
    (they feed tensor-core products). fp32 inputs multiply in IEEE fp32
    (`tl.dot` with input_precision="ieee"), so they are fp32-accurate on the
    GPU too.

    Differentiable in q, k, v, gk and initial_state, through o and the final
    state: the backward (attention_kernels/linear/chunk_backward.py) takes
    the inputs and the forward's scores A (kept only when a gradient is
    needed: CHUNK values a token and head in q's dtype) and recomputes the
    rest. A gate below GATE_FLOOR (-inf) gets gradient 0.

    fla's arguments in fla's order: the gate is `g` (fla's name, fourth) or
    `gk` (keyword, the name the other forms use), one of them;
    state_v_first=True takes initial_state as [B, H, V, K] and returns the
    final state so (a transposed view; gradients flow through it).
    cu_seqlens: packed sequences (the module docstring); cu_seqlens_cpu,
    fla's host copy of them, must be None (ValueError naming it).

        >>> q, k, v, gk = torch.randn(4, 1, 4096, 32, 128, device="cuda",
        ...                           dtype=torch.bfloat16).unbind(0)
        >>> gk = (torch.nn.functional.logsigmoid(gk.float())
        ...       / 16).requires_grad_()
        >>> o, _ = chunk_gla(q, k, v, gk); o.sum().backward()
        ...     # gk.grad: [1, 4096, 32, 128]
    """
    if g is not None and gk is not None:
        raise ValueError("g and gk are two names of chunk_gla's gate (fla's and this module's): pass one")
    if g is None and gk is None:
        raise TypeError("chunk_gla needs its gate: g (or gk), [B, T, H, K], log of the decay")
    gate_name, gate = ("g", g) if g is not None else ("gk", gk)
    _refuse_fla_options("chunk_gla", cu_seqlens_cpu=cu_seqlens_cpu)
    initial_state = _state_in(initial_state, state_v_first, q, v, cu_seqlens)
    _, scale, (q, k, v, gate, h0) = _checked(q, k, v, gate, scale, initial_state, output_final_state, cu_seqlens,
                                             gate_name)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, gate, h0)):
        o, ht = ChunkGLAFunction.apply(q, k, v, gate, scale, h0, output_final_state, cu_seqlens)
    else:
        o, ht = _chunk_gla_fwd(q, k, v, gate, scale, h0, output_final_state, cu_seqlens)
    return o, _state_out(ht, state_v_first)


def chunk_gla_tilelang(q, k, v, g, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Chunk-parallel GLA forward with the TileLang kernels (`tilelang_chunk.py`): the same math and
    chunks of 64 tokens as chunk_gla, for comparison with it.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; g = log of the per-channel decay (fla's name for chunk_gla's
    gate, fourth). q, k, v bf16 or fp16, g any float dtype; K and V each 64 or 128; scale defaults to
    K ** -0.5; initial_state fp32 [B, H, K, V] or None (zeros). CUDA tensors only, none requiring grad
    (no backward); cu_seqlens must be None (no packed sequences); needs TileLang (RuntimeError without
    it). The first call with a new (K, V, dtype, gate dtype) compiles the two kernels, a few seconds
    each; B, T and H are runtime. Returns (o [B, T, H, V] in v's dtype, final_state fp32 [B, H, K, V]
    when output_final_state, else None).

        >>> q, k, v, g = torch.randn(4, 1, 4096, 32, 128, device="cuda", dtype=torch.bfloat16).unbind(0)
        >>> g = torch.nn.functional.logsigmoid(g.float()) / 16
        >>> o, S = chunk_gla_tilelang(q, k, v, g, output_final_state=True)     # S: [1, 32, 128, 128]
    """
    # ---- validate before anything else (the same answers with or without TileLang)
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens must be None: chunk_gla_tilelang takes one sequence per batch row "
                         "(chunk_gla takes packed sequences)")
    (_, _, _, K, V), scale, (q, k, v, g, h0) = _checked(q, k, v, g, scale, initial_state, output_final_state,
                                                        gate_name="g")
    check_tensor("q", q, dtypes=tuple(tilelang_chunk.DTYPES))
    dims = tilelang_chunk.HEAD_DIMS
    if K not in dims or V not in dims:
        raise ValueError(f"the TileLang kernels are built for head dims K, V in {dims}, got K={K}, V={V}")
    check_no_grad("chunk_gla_tilelang", q=q, k=k, v=v, g=g, initial_state=h0)
    if peers.tilelang() is None:
        raise RuntimeError("chunk_gla_tilelang needs TileLang (`pip install tilelang`), which is not installed here")
    for name, t in {"q": q, "k": k, "v": v, "g": g, "initial_state": h0}.items():
        if t is not None and t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}: the TileLang kernels run on a CUDA GPU and take CUDA tensors")
    return tilelang_chunk.launch_tilelang(q, k, v, g, scale, h0, output_final_state)
