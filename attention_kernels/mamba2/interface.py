"""Mamba-2's public entry points: validate, allocate what is returned, launch. Names, arguments and
layouts as mamba_ssm's Triton ops (`selective_state_update`, the SSD chunk scan), see inputs.py.
The scan trains (SSDChunkScanFunction: the backward recomputes from the inputs and, where z is given,
takes the forward's output before its gate, chunk.py's `ssd_chunk_scan_bwd`) and takes packed sequences
(cu_seqlens); the decode step has no backward. The layer's output norm, `rmsnorm_fn` and its module
`RMSNormGated` (mamba_ssm's gated RMSNorm), trains too (GatedRMSNormFunction, norm.py's kernels).

The slot table's values (state_batch_indices) are checked only when it is on the CPU: on the GPU the
check would read device memory and wait for the GPU on every decode step, which is the cost the step
is built to avoid (as the Lightning chapter leaves its slopes unchecked). On the GPU an index outside
[0, slots), or a slot named twice (two rows updating one slot in place: which write lands is
undefined), is the caller's error, as it is in mamba_ssm.
"""
from __future__ import annotations

import torch

from ..checks import check_gradient, check_offset_values, check_tensor
from ..custom_ops import compiled_as_op, gated_rmsnorm_fake, gradients_like, like, ssd_chunk_scan_fake
from .chunk import ssd_chunk_scan_bwd, ssd_chunk_scan_fwd
from .inputs import check_norm_inputs, check_scan_inputs, check_step_inputs
from .decode import selective_state_update_fwd
from .norm import gated_rmsnorm_bwd, gated_rmsnorm_fwd


def a_is_scalar_per_head(A: torch.Tensor) -> bool:
    """A [nheads, headdim, dstate] holds one number per head, broadcast with stride 0 (how a Mamba-2
    model passes it): the kernel's fast path."""
    return A.stride(1) == 0 and A.stride(2) == 0


@compiled_as_op("attention_kernels::selective_state_update", fake=like("x"), mutates_args=("state",))
def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None):
    """One Mamba-2 decode step (Triton), the state updated in place.

    state: fp32 [b, nheads, headdim, dstate], or [slots, ...] with
    state_batch_indices (int [b]: batch row i reads and writes
    state[state_batch_indices[i]]; a slot named twice is refused on the CPU
    and undefined on the GPU, as in mamba_ssm). state is updated where it
    lies (any strides, not expanded: stride 0 is refused).
    x, dt, z: [b, nheads, headdim];
    A: [nheads, headdim, dstate] (stride-0 broadcast of one scalar per head:
    the fast path);
    B, C: [b, ngroups, dstate], ngroups dividing nheads;
    D, dt_bias: [nheads, headdim].
    x, B, C, z one dtype (fp16, bf16 on a GPU, fp32); dt, A, D, dt_bias any
    of them. dstate <= 256.
    Returns y [b, nheads, headdim] in x's dtype.

        >>> A = (-torch.exp(A_log))[:, None, None].expand(80, 64, 128)
        ...     # one scalar per head, stride 0
        >>> y = selective_state_update(state, x, dt, A, B, C, D=D, z=z,
        ...                            dt_bias=dt_bias, dt_softplus=True)
    """
    check_step_inputs(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)
    x, B, C = x.contiguous(), B.contiguous(), C.contiguous()
    z = None if z is None else z.contiguous()
    # the kernel reads the slot table as contiguous (a no-op when it is, as a
    # serving engine's is)
    slots = None if state_batch_indices is None else state_batch_indices.contiguous()
    y = torch.empty_like(x)
    selective_state_update_fwd(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, slots, y,
                               a_is_scalar_per_head(A))
    return y


def _sequences(cu_seqlens, T: int) -> list[tuple[int, int]]:
    """The packed sequences' (first row, end row), from one host read of the offsets, checked."""
    offsets = cu_seqlens.tolist()
    check_offset_values(offsets, T)
    return list(zip(offsets[:-1], offsets[1:]))


def _rows(t, start: int, end: int):
    return None if t is None else t[:, start:end]


# The forward and backward launchers are ops (as GLA's and FlashAttention's are): torch.compile traces
# SSDChunkScanFunction itself, so a compiled graph's forward and backward are eager's, each launcher one node.
@compiled_as_op("attention_kernels::ssd_chunk_scan_fwd", fake=ssd_chunk_scan_fake, tuple_size=2)
def _ssd_chunk_scan_fwd(x, dt, A, B, C, chunk_size: int, D: torch.Tensor | None, z: torch.Tensor | None,
                        dt_bias: torch.Tensor | None, dt_softplus: bool, initial_states: torch.Tensor | None,
                        return_final_states: bool, cu_seqlens: torch.Tensor | None):
    """The scan's launches (checked here) without a backward to follow (it keeps nothing), once, or once per
    packed sequence; returns (y, final states or None)."""
    dims = check_scan_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                             return_final_states, cu_seqlens)
    return _forward_dense_or_packed(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                                    return_final_states, cu_seqlens, None)


def _keeping_ungated_fake(x, B, return_final_states, cu_seqlens=None, **_):
    """The training forward's outputs: the forward's (y, final states or None) with the ungated output between."""
    y, final = ssd_chunk_scan_fake(x=x, B=B, return_final_states=return_final_states, cu_seqlens=cu_seqlens)
    return y, x.new_empty(x.shape), final


@compiled_as_op("attention_kernels::ssd_chunk_scan_fwd_keeping_ungated", fake=_keeping_ungated_fake, tuple_size=3)
def _ssd_chunk_scan_fwd_keeping_ungated(x, dt, A, B, C, chunk_size: int, D: torch.Tensor | None, z: torch.Tensor,
                                        dt_bias: torch.Tensor | None, dt_softplus: bool,
                                        initial_states: torch.Tensor | None, return_final_states: bool,
                                        cu_seqlens: torch.Tensor | None):
    """The training forward with a gate (SSDChunkScanFunction's where z is given): `_ssd_chunk_scan_fwd`, and
    it returns the output before its gate too, (y, y_ungated, final states or None) with y_ungated = o + D ⊙ x
    in x's shape and dtype, stored by the output kernel beside y (one more store, no launch), for the backward
    to take for z's gradient instead of launching the output kernel again, as mamba_ssm's forward keeps it."""
    dims = check_scan_inputs(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                             return_final_states, cu_seqlens)
    if z is None:
        raise ValueError("z must be given: the output kept is the one before z's gate")
    y_ungated = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y, final = _forward_dense_or_packed(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus,
                                        initial_states, return_final_states, cu_seqlens, y_ungated)
    return y, y_ungated, final


def _forward_dense_or_packed(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                             return_final_states, cu_seqlens, y_ungated):
    """The scan, once or once per packed sequence, its ungated output written into y_ungated where given (a
    packed sequence's into its rows)."""
    if cu_seqlens is None:
        return ssd_chunk_scan_fwd(dims, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states,
                                  return_final_states, y_ungated)
    # packed: each sequence is a scan of its own, cut into chunks from its first row (the launches per
    # sequence, on views of its rows)
    _, T, H, P, N, G = dims
    sequences = _sequences(cu_seqlens, T)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    final = (torch.empty(len(sequences), H, P, N, dtype=torch.float32, device=x.device) if return_final_states
             else None)
    for n, (start, end) in enumerate(sequences):
        h0 = None if initial_states is None else initial_states[n:n + 1]
        if start == end:                  # an empty sequence ends in the state it starts from
            if final is not None:
                final[n] = 0.0 if h0 is None else h0[0]
            continue
        # batch 1: a sequence's rows of y_ungated are a contiguous view, written in place
        y_n, final_n = ssd_chunk_scan_fwd(
            (1, end - start, H, P, N, G), x[:, start:end], dt[:, start:end], A, B[:, start:end], C[:, start:end],
            chunk_size, D, _rows(z, start, end), dt_bias, dt_softplus, h0, return_final_states,
            _rows(y_ungated, start, end))
        y[:, start:end] = y_n
        if final is not None:
            final[n] = final_n[0]
    return y, final


@compiled_as_op("attention_kernels::ssd_chunk_scan_bwd",
                fake=gradients_like("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states"))
def _ssd_chunk_scan_bwd(x, dt, A, B, C, D: torch.Tensor | None, z: torch.Tensor | None,
                        dt_bias: torch.Tensor | None, dt_softplus: bool, initial_states: torch.Tensor | None,
                        dy, dfinal: torch.Tensor | None, cu_seqlens: torch.Tensor | None,
                        y_ungated: torch.Tensor | None = None):
    """`ssd_chunk_scan_bwd` (chunk.py), once, or once per packed sequence: the rows of a sequence get its
    gradients, A, D and dt_bias the sum over the sequences (in fp32), initial_states[n] sequence n's.
    y_ungated: with z, the forward's output before its gate (`_ssd_chunk_scan_fwd_keeping_ungated`), or None
    to recompute it."""
    Bt, T, H, P, N, _ = check_scan_inputs(x, dt, A, B, C, 64, D, z, dt_bias, dt_softplus, initial_states,
                                          dfinal is not None, cu_seqlens)
    check_gradient("dy", dy, x.shape, x.dtype, x.device)
    if dfinal is not None:
        states = Bt if cu_seqlens is None else cu_seqlens.shape[0] - 1
        check_gradient("dfinal", dfinal, (states, H, P, N), torch.float32, x.device)
    if y_ungated is not None:
        if z is None:
            raise ValueError("y_ungated is the output before z's gate: it is given only with z")
        check_tensor("y_ungated", y_ungated, dtypes=(x.dtype,), shape=tuple(x.shape))
        if y_ungated.device != x.device:
            raise ValueError(f"y_ungated is on {y_ungated.device}; x is on {x.device}")
    if cu_seqlens is None:
        return ssd_chunk_scan_bwd(x, dt, A, B, C, D, z, dt_bias, dt_softplus, initial_states, dy, dfinal,
                                  y_ungated)
    inputs = {"x": x, "dt": dt, "A": A, "B": B, "C": C, "D": D, "z": z, "dt_bias": dt_bias,
              "initial_states": initial_states}
    given = [name for name, t in inputs.items() if t is not None]
    shared = ("A", "D", "dt_bias")                          # one value for every sequence: summed
    grads = {name: torch.zeros(inputs[name].shape, device=x.device,
                               dtype=torch.float32 if name in shared else inputs[name].dtype) for name in given}
    for n, (start, end) in enumerate(_sequences(cu_seqlens, x.shape[1])):
        h0 = None if initial_states is None else initial_states[n:n + 1]
        dh = None if dfinal is None else dfinal[n:n + 1]
        if start == end:                  # the final state is the initial one
            if h0 is not None and dh is not None:
                grads["initial_states"][n] = dh[0]
            continue
        part = ssd_chunk_scan_bwd(x[:, start:end], dt[:, start:end], A, B[:, start:end], C[:, start:end], D,
                                  _rows(z, start, end), dt_bias, dt_softplus, h0, dy[:, start:end], dh,
                                  _rows(y_ungated, start, end))
        for name, g in zip(given, part, strict=True):
            if name in shared:
                grads[name] += g
            elif name == "initial_states":
                grads[name][n] = g[0]
            else:
                grads[name][:, start:end] = g
    return tuple(grads[name].to(inputs[name].dtype) for name in given)


class SSDChunkScanFunction(torch.autograd.Function):
    """ssd_chunk_scan's arguments in, (y, final states or None) out. Forward: at the caller's chunk size,
    `_ssd_chunk_scan_fwd_keeping_ungated` where z is given, saving the inputs and the output before the gate,
    o + D ⊙ x (one [B, T, H, P] tensor in x's dtype, kept from the forward to the backward, for z's gradient),
    else `_ssd_chunk_scan_fwd`, saving the inputs only. Backward: `_ssd_chunk_scan_bwd`, which recomputes the
    gates and the chunk-start states in chunks of 64 (Triton kernels, and the elementwise parts in PyTorch)."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, return_final_states,
                cu_seqlens):
        args = (x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, return_final_states,
                cu_seqlens)
        if z is None:
            (y, final), y_ungated = _ssd_chunk_scan_fwd(*args), None
        else:
            y, y_ungated, final = _ssd_chunk_scan_fwd_keeping_ungated(*args)
        ctx.save_for_backward(x, dt, A, B, C, D, z, dt_bias, initial_states, cu_seqlens, y_ungated)
        ctx.dt_softplus = dt_softplus
        ctx.set_materialize_grads(False)
        return y, final

    @staticmethod
    @torch.autograd.function.once_differentiable     # the kernels' gradients carry no graph of their own
    def backward(ctx, dy, dfinal):
        *saved, cu_seqlens, y_ungated = ctx.saved_tensors
        x, dt, A, B, C, D, z, dt_bias, h0 = saved
        dy = torch.zeros_like(x) if dy is None else dy.contiguous()
        dfinal = None if dfinal is None else dfinal.contiguous()
        # one gradient per given input, in order: spread over the inputs, None for an absent one
        grads = iter(_ssd_chunk_scan_bwd(x, dt, A, B, C, D, z, dt_bias, ctx.dt_softplus, h0, dy, dfinal,
                                         cu_seqlens, y_ungated))
        dx, ddt, dA, dB, dC, dD, dz, ddt_bias, dh0 = [None if t is None else next(grads) for t in saved]
        return dx, ddt, dA, dB, dC, None, dD, dz, ddt_bias, None, dh0, None, None


def ssd_chunk_scan(x, dt, A, B, C, chunk_size=64, D=None, z=None, dt_bias=None, dt_softplus=False,
                   initial_states=None, return_final_states=False, cu_seqlens=None):
    """The SSD chunk scan (Triton): Mamba-2's prefill, in chunks of chunk_size tokens, and training.
    See chunk.py.

    x, z: [batch, seqlen, nheads, headdim]; dt: [batch, seqlen, nheads]; A: [nheads]; B, C:
    [batch, seqlen, ngroups, dstate], ngroups dividing nheads; D: [nheads, headdim] or [nheads];
    dt_bias: [nheads]; initial_states: fp32 [batch, nheads, headdim, dstate]. x, B, C, z one dtype
    (fp16, bf16 on a GPU, fp32); dt, A, D, dt_bias any of them. chunk_size: 16, 32, 64 (the
    default), 128 or 256 (mamba_ssm's Mamba-2 default); the same answer at each, up to rounding.
    headdim, dstate <= 256. In a Mamba-2 model dt (after dt_bias and the softplus) >= 0 and A <= 0, so every
    decay e^{dt·A} is <= 1; other signs (an A_log passed as A, a negative dt without the softplus)
    give the recurrence's answer too, as the step does, until the growing state overflows. Returns
    y [batch, seqlen, nheads, headdim] in x's dtype, or (y, final_states fp32 [batch, nheads,
    headdim, dstate]) when return_final_states.

    Differentiable in x, dt, A, B, C, D, z, dt_bias and initial_states, through y and the final states:
    the backward saves the inputs, and with z the output before its gate, o + D ⊙ x (stored by the
    forward's output kernel beside y: one [batch, seqlen, nheads, headdim] tensor in x's dtype, kept from
    the forward to the backward only when z is given and a gradient is needed), and recomputes the rest
    in chunks of 64 tokens, whatever chunk_size the forward took (attention_kernels/linear/chunk_backward.py,
    and chunk.py's `ssd_chunk_scan_bwd`). A decay e^{dt·A} below e^-110 counts as 0, and its dt·A gets no gradient
    through the decay.

    Packed sequences: cu_seqlens, int32 [N + 1] on x's device (0 first, seqlen last, non-decreasing; a
    length may be 0), with batch 1: sequence n is rows cu_seqlens[n] to cu_seqlens[n + 1] of x, dt, B,
    C, z, and sees nothing of the others; initial_states and the final states are then [N, nheads,
    headdim, dstate], one per sequence. mamba_ssm's chunk scan takes both seq_idx (a sequence number per
    row, [batch, seqlen]) and cu_seqlens; here the offsets alone say everything, as in flash-attn's
    packed calls, so cu_seqlens is the one keyword. Each sequence is cut into chunks from its own first
    row (a sequence starting mid-chunk shares no chunk with the one before) and scanned on views of its
    rows: the offsets are read on the host once per call (and once per backward), which waits for the
    GPU, so a packed call cannot be captured in a CUDA graph; and the launches are per sequence (three
    kernels forward, six or seven and the elementwise ops backward), which costs host time when the
    sequences are many and short.

        >>> y, h = ssd_chunk_scan(x, dt, -torch.exp(A_log), B, C, chunk_size=256, D=D, z=z,
        ...                       dt_bias=dt_bias, dt_softplus=True, return_final_states=True)
        >>> y_next = selective_state_update(h, x_t, dt_t, A_t, B_t, C_t, ...)   # decode continues from h
        >>> y, h = ssd_chunk_scan(x, dt, A, B, C, cu_seqlens=torch.tensor([0, 70, 300], dtype=torch.int32,
        ...                       device=x.device), return_final_states=True)   # x [1, 300, ...]; h [2, ...]
    """
    args = (x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, initial_states, return_final_states,
            cu_seqlens)
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad    # else: the checks name it
                                       for t in (x, dt, A, B, C, D, z, dt_bias, initial_states)):
        y, final = SSDChunkScanFunction.apply(*args)
    else:
        y, final = _ssd_chunk_scan_fwd(*args)
    return (y, final) if return_final_states else y


# ---------------------------------------------------------------- the layer's output norm
def _as_rows(t, N: int):
    """t [..., N] as rows [M, N] with unit stride inside a row (a view where it can be)."""
    t = t.reshape(-1, N)
    return t if t.stride(-1) == 1 else t.contiguous()


@compiled_as_op("attention_kernels::gated_rmsnorm_fwd", fake=gated_rmsnorm_fake, tuple_size=2)
def _gated_rmsnorm_fwd(x, weight, bias: torch.Tensor | None, z: torch.Tensor | None, eps: float, group_size: int,
                       norm_before_gate: bool):
    """The norm's launch (checked here): (out like x, fp32 rstd [rows, N / group_size])."""
    check_norm_inputs(x, weight, bias, z, eps, group_size, norm_before_gate)
    N = x.shape[-1]
    out, rstd = gated_rmsnorm_fwd(_as_rows(x, N), weight.contiguous(), None if bias is None else bias.contiguous(),
                                  None if z is None else _as_rows(z, N), eps, group_size, norm_before_gate)
    return out.view(x.shape), rstd


@compiled_as_op("attention_kernels::gated_rmsnorm_bwd", fake=gradients_like("x", "weight", "bias", "z"))
def _gated_rmsnorm_bwd(x, weight, bias: torch.Tensor | None, z: torch.Tensor | None, rstd, dout, group_size: int,
                       norm_before_gate: bool):
    """The norm's backward launch: the gradients of x, weight, and of bias and z where given, in that order."""
    rows, N, _ = check_norm_inputs(x, weight, bias, z, 0.0, group_size, norm_before_gate)
    check_gradient("dout", dout, x.shape, x.dtype, x.device)
    check_tensor("rstd", rstd, dtypes=(torch.float32,), shape=(rows, N // group_size))
    dx, dweight, dbias, dz = gated_rmsnorm_bwd(
        _as_rows(x, N), weight.contiguous(), None if bias is None else bias.contiguous(),
        None if z is None else _as_rows(z, N), rstd.contiguous(), _as_rows(dout, N), group_size, norm_before_gate)
    grads = (dx.view(x.shape), dweight, dbias, None if dz is None else dz.view(x.shape))
    return tuple(g for g in grads if g is not None)


class GatedRMSNormFunction(torch.autograd.Function):
    """rmsnorm_fn's arguments in (group_size resolved to an int), out out. Forward: `_gated_rmsnorm_fwd`, saving
    the inputs and rstd per (row, group). Backward: `_gated_rmsnorm_bwd`, one pass over the rows that recomputes
    the normalised input from x (and z) and rstd."""

    @staticmethod
    def forward(ctx, x, weight, bias, z, eps, group_size, norm_before_gate):
        out, rstd = _gated_rmsnorm_fwd(x, weight, bias, z, eps, group_size, norm_before_gate)
        ctx.save_for_backward(x, weight, bias, z, rstd)
        ctx.group_size, ctx.norm_before_gate = group_size, norm_before_gate
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable     # the kernels' gradients carry no graph of their own
    def backward(ctx, dout):
        x, weight, bias, z, rstd = ctx.saved_tensors
        grads = iter(_gated_rmsnorm_bwd(x, weight, bias, z, rstd, dout.contiguous(), ctx.group_size,
                                        ctx.norm_before_gate))
        dx, dweight, dbias, dz = [None if t is None else next(grads) for t in (x, weight, bias, z)]
        return dx, dweight, dbias, dz, None, None, None


def rmsnorm_fn(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
    """The gated RMSNorm of a Mamba-2 layer (Triton, one pass each way), mamba_ssm's `rmsnorm_fn`. See norm.py.

    x, z: [..., N], one dtype (fp16, bf16 on a GPU, fp32); weight, bias: [N] (any of those dtypes); bias and z
    optional. Each row is cut into groups of group_size channels (None, the default: one group, the whole row;
    else it must divide N, and a group holds at most 8192 channels). Per group, rstd(v) = 1 / sqrt(mean(v²) + eps):
    norm_before_gate=True (the default): out = (x · rstd(x) · weight + bias) · silu(z); norm_before_gate=False (a
    Mamba-2 layer's call): g = x · silu(z), out = g · rstd(g) · weight + bias; without z, out = x · rstd(x) ·
    weight + bias. The math in fp32; returns out in x's shape and dtype. Differentiable in x, weight, bias and z:
    the forward keeps rstd per (row, group) in fp32, the backward recomputes the rest from the inputs.

        >>> y = ssd_chunk_scan(x, dt, A, B, C, chunk_size=64, D=D, dt_bias=dt_bias, dt_softplus=True)
        >>> out = rmsnorm_fn(y.flatten(-2), weight, None, z=z, eps=1e-5, group_size=d_inner // ngroups,
        ...                  norm_before_gate=False)                   # y, z [batch, seqlen, d_inner]
    """
    group_size = check_norm_inputs(x, weight, bias, z, eps, group_size, norm_before_gate)[2]
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias, z)):
        return GatedRMSNormFunction.apply(x, weight, bias, z, eps, group_size, norm_before_gate)
    return _gated_rmsnorm_fwd(x, weight, bias, z, eps, group_size, norm_before_gate)[0]


class RMSNormGated(torch.nn.Module):
    """mamba_ssm's gated RMSNorm module (imported in its Mamba-2 block as `RMSNormGated`): a weight of ones, no
    bias, and `rmsnorm_fn` in forward. Constructor as mamba_ssm's, so a block's norm swaps in one line.

        >>> norm = RMSNormGated(d_inner, eps=1e-5, norm_before_gate=False, group_size=d_inner // ngroups,
        ...                     device="cuda", dtype=torch.bfloat16)
        >>> out = norm(y, z)                                             # y, z [batch, seqlen, d_inner]
    """

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.empty(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        torch.nn.init.ones_(self.weight)

    def forward(self, x, z=None):
        """out = rmsnorm_fn(x, weight, None, z, eps, group_size, norm_before_gate): x, z [..., hidden_size]."""
        return rmsnorm_fn(x, self.weight, self.bias, z=z, eps=self.eps, group_size=self.group_size,
                          norm_before_gate=self.norm_before_gate)


__all__ = ["selective_state_update", "ssd_chunk_scan", "a_is_scalar_per_head", "rmsnorm_fn", "RMSNormGated",
           "GatedRMSNormFunction"]
