"""Ring attention over torch.distributed: one sequence split across the ranks of a process group, the
K/V slices passed around the ring, each rank running attention_kernels.flash_attn's Triton kernels on the block
it holds and merging the partial results through their log-sum-exp.

The communication is PyTorch's own point-to-point API (`dist.batch_isend_irecv` of `P2POp`s): NCCL on
GPUs, gloo on CPUs (where the kernels run under Triton's interpreter). Each step posts the exchange of
the next K/V slice before it computes on the current one, so the transfer hides behind the compute
when the compute is the longer of the two.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..checks import FLOATS, check_choice, check_kernel_device
from ..flash_attn.backward import attention_bwd
from ..flash_attn.forward import attention_fwd
from ..flash_attn.interface import SUPPORTED_HEAD_DIMS, _one_launch
from ..flash_attn.reference import check_attention_args
from .reference import merge_into
from .zigzag import ring_plan


# ---------------------------------------------------------------------------------- the ring
class _Exchange:
    """One posted exchange: what was sent and the buffers being received, both referenced until
    wait() (a buffer freed while the transfer is in flight would be reused under it)."""

    def __init__(self, sent, received, works):
        self.sent, self.received, self.works = sent, received, works

    def wait(self):
        for work in self.works:
            work.wait()
        self.sent = self.works = None
        return self.received


class Ring:
    """The ranks of `group` in a ring: rank r sends to r + 1 and receives from r - 1 (mod world).

    >>> ring = Ring(group=None)                     # the default process group
    >>> pending = ring.exchange((k, v))             # post: send k, v forward, receive the previous rank's
    >>> k, v = pending.wait()
    """

    def __init__(self, group=None):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        g = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(g, (self.rank + 1) % self.world)
        self.prev = dist.get_global_rank(g, (self.rank - 1) % self.world)

    def exchange(self, tensors) -> _Exchange:
        """Post sends of `tensors` (contiguous) to the next rank and receives of same-shaped tensors
        from the previous one, as one batch. A ring of one rank receives what it sends."""
        if self.world == 1:
            return _Exchange(tensors, tensors, [])
        received = tuple(torch.empty_like(t) for t in tensors)
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, self.prev, self.group) for t in received]
        return _Exchange(tensors, received, dist.batch_isend_irecv(ops))


def _rows(plan, n: int):
    """The local query rows and the K/V rows a plan uses (each a slice of the n local tokens)."""
    q_rows = slice(0, n) if plan.queries == "all" else slice(n // 2, n)
    kv_rows = slice(0, n) if plan.keys == "all" else slice(0, n // 2)
    return q_rows, kv_rows


def ring_forward(q, k, v, causal: bool, softmax_scale: float, ring: Ring):
    """The forward ring (inputs validated, contiguous). Returns (o [B, T, Hq, D] in q's dtype,
    lse fp32 [B, Hq, T], base 2) for the local query slice, over every key of the sequence."""
    B, n, HQ, D = q.shape
    o = torch.zeros((B, n, HQ, D), device=q.device, dtype=torch.float32)
    lse = torch.full((B, HQ, n), float("-inf"), device=q.device, dtype=torch.float32)
    kv = (k, v)
    for step in range(ring.world):
        pending = ring.exchange(kv) if step + 1 < ring.world else None  # post the next slice's transfer first
        plan = ring_plan(ring.rank, step, ring.world, causal)
        qr, kr = _rows(plan, n)
        o_b, lse_b = attention_fwd(q[:, qr].contiguous(), kv[0][:, kr].contiguous(), kv[1][:, kr].contiguous(),
                                   plan.causal, softmax_scale)
        merge_into(o[:, qr], lse[..., qr], o_b, lse_b)  # fp32, in place
        if pending is not None:
            kv = pending.wait()
    return o.to(q.dtype), lse


def ring_backward(do, q, k, v, o, lse, causal: bool, softmax_scale: float, ring: Ring):
    """The backward ring. Every block's gradient comes from `attention_bwd` given the GLOBAL o and lse
    (so its P and delta = rowsum(dO ∘ O) are those of the whole sequence): dq sums locally, while each
    K/V slice's dk, dv (fp32) travel around the ring with it, gather every rank's contribution, and take
    one last step home. Returns (dq, dk, dv) in the input dtypes."""
    B, n, HQ, D = q.shape
    do = do.contiguous()
    dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    kv, dkv_pending = (k, v), None
    for step in range(ring.world):
        kv_pending = ring.exchange(kv) if step + 1 < ring.world else None
        plan = ring_plan(ring.rank, step, ring.world, causal)
        qr, kr = _rows(plan, n)
        q_b, k_b, v_b = q[:, qr].contiguous(), kv[0][:, kr].contiguous(), kv[1][:, kr].contiguous()
        dq_b, dk_b, dv_b = attention_bwd(do[:, qr].contiguous(), q_b, k_b, v_b, o[:, qr].contiguous(),
                                         lse[..., qr].contiguous(), plan.causal, softmax_scale,
                                         _one_launch(q_b, k_b, plan.causal))
        dq[:, qr] += dq_b
        if dkv_pending is None:  # step 0: this slice's accumulators start here
            dk_acc, dv_acc = torch.zeros_like(k, dtype=torch.float32), torch.zeros_like(v, dtype=torch.float32)
        else:  # they arrived from the previous rank, which held this slice one step ago
            dk_acc, dv_acc = dkv_pending.wait()
        dk_acc[:, kr] += dk_b
        dv_acc[:, kr] += dv_b
        dkv_pending = ring.exchange((dk_acc, dv_acc))  # after the last step this sends them home
        if kv_pending is not None:
            kv = kv_pending.wait()
    dk, dv = dkv_pending.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class RingFlashAttnFunction(torch.autograd.Function):
    """Forward: `ring_forward` (saves the local q, k, v, the merged o and its lse). Backward: `ring_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, group):
        ring = Ring(group)
        o, lse = ring_forward(q, k, v, causal, softmax_scale, ring)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.softmax_scale, ctx.ring = causal, softmax_scale, ring
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(do, q, k, v, o, lse, ctx.causal, ctx.softmax_scale, ctx.ring)
        return dq, dk, dv, None, None, None


# ---------------------------------------------------------------------------------- checks
def _validate(q, k, v, causal, softmax_scale, group) -> float:
    """Raise TypeError/ValueError naming the argument, before any communication; return the scale."""
    scale = check_attention_args(q, k, v, causal, softmax_scale, dtypes=FLOATS)
    check_kernel_device(q=q, k=k, v=v)
    check_choice("head dim D of q, k, v", q.shape[-1], SUPPORTED_HEAD_DIMS)
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"k and v must hold the same tokens as q (self-attention over one split sequence): "
                         f"q has {q.shape[1]} local tokens, k and v {k.shape[1]}")
    if q.shape[1] * q.shape[2] * q.shape[3] >= 2 ** 31:
        raise ValueError(f"q: one sequence slice of {q.shape[1]} tokens x {q.shape[2]} heads x {q.shape[3]} exceeds "
                         "the int32 row offsets of attention_kernels.flash_attn (2^31 elements); use more ranks")
    if causal and q.shape[1] % 2:
        raise ValueError(f"q, k, v: causal ring attention takes the zig-zag layout (two equal chunks per rank), "
                         f"so the local length must be even, got {q.shape[1]}")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("group: torch.distributed is not initialized (call dist.init_process_group first)")
    if dist.get_rank(group) < 0:
        raise ValueError("group: this rank is not a member of the process group")
    backend = str(dist.get_backend(group))
    if backend == "nccl" and q.device.type != "cuda":
        raise ValueError(f"q is on {q.device}, but group's backend is nccl, which sends CUDA tensors")
    if backend == "gloo" and q.device.type != "cpu":
        raise ValueError(f"q is on {q.device}, but group's backend is gloo, whose point-to-point ops send CPU tensors")
    return scale


def ring_flash_attn_func(q, k, v, causal=False, group=None, softmax_scale=None):
    """Ring attention (FlashAttention-2 blocks, K/V passed around the ranks of `group`), differentiable.

    q: [B, T/W, Hq, D]; k, v: [B, T/W, Hkv, D]: this rank's slice of a sequence of T tokens split
    over the W ranks of `group` (default: the world), Hq a multiple of Hkv (GQA). Layout: with
    causal=True the zig-zag split (`zigzag_split`: chunks r and 2W-1-r of 2W, so T/W is even); with
    causal=False the contiguous split (`contiguous_split`). D in (32, 64, 128, 256); fp16, bf16 or fp32
    as attention_kernels.flash_attn takes them (CUDA tensors with NCCL, CPU tensors under the interpreter with
    gloo). softmax_scale defaults to 1/sqrt(D). Every rank of the group must call it with the same
    shapes. Returns this rank's o: [B, T/W, Hq, D] in q's dtype; the backward gives dq, dk, dv of the
    local slices. The merge and the gradient accumulators are fp32.

    >>> q, k, v = (zigzag_split(t, dist.get_rank(), dist.get_world_size()).requires_grad_() for t in (Q, K, V))
    >>> o = ring_flash_attn_func(q, k, v, causal=True)    # this rank's rows of attention over all of T
    >>> o.sum().backward()                                 # q.grad, k.grad, v.grad: local slices
    """
    scale = _validate(q, k, v, causal, softmax_scale, group)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return RingFlashAttnFunction.apply(q, k, v, causal, scale, group)
    return ring_forward(q, k, v, causal, scale, Ring(group))[0]


__all__ = ["ring_flash_attn_func", "RingFlashAttnFunction", "Ring", "ring_forward", "ring_backward"]
