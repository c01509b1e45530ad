"""How an MLA decode call is run: which kernel, how many slices, which workspace; and the plans that keep
those decisions for the calls like it.

Two kernels serve one contract (FlashMLA's). On a Hopper GPU the common serving case (bf16, one query
token, DeepSeek's 576/512 dims, a contiguous cache or FlashMLA's paged one with pages of 64 positions)
goes to the hand-scheduled Gluon kernel (`gluon_decode.py`, a copy warp and two ping-pong warpgroups), on
the Tritons it was measured on (`attention_kernels.launch.TESTED_TRITON`); every other call to the Triton kernel
(`decode.py`). Both cut long sequences into slices when the batch is too small to fill the GPU (split-KV,
`num_splits`), and share the kernel that merges the slices, whose partials live in a `workspace` kept per
stream and shape.

A call's decisions are made once per input signature (`plan_key`: the tensors' shapes, strides, dtypes,
devices and alignment, and the other arguments) and kept as a `Plan`, as FlashMLA keeps its scheduling
metadata: a later call with that signature only allocates its output and launches, and once the plan holds
the compiled kernels' launches (`attention_kernels.launch.relaunches`), it reads the stream once and calls Triton's C
launcher for each.

    >>> plan = plan_decode(q, kv_cache, block_table, cache_seqlens, 512, scale, False, None, "auto", longest)
    >>> out, lse = plan(q, kv_cache, block_table, cache_seqlens)
"""
from __future__ import annotations

import functools
import math

import torch
import triton

from ..launch import (TESTED_TRITON, cdiv, fast_paths_on, is_hopper, launch_hooked, launch_stream, relaunches, reused,
                      sm_count, tma_ready)
from . import decode, gluon_decode
from .inputs import paged_rows

BACKENDS = ("auto", "triton", "gluon")
PLAN_HEAD_BLOCK = 64   # the head block the split cost model assumes (the kernels' on the GPU)
PLAN_SM_COUNT = 132    # off the GPU (the interpreter), split as an H200 would


@functools.lru_cache(maxsize=1024)  # a decode loop asks the same question every step: answer it once
def num_splits(B: int, n_hblocks: int, max_len: int, n_sm: int) -> int:
    """How many slices to cut each sequence into, by a small cost model in
    units of 'one cache position processed by one program' (about 30 ns for
    64 heads on an H200 SM): waves * (positions per slice + ~64 fixed per
    program), plus, when splitting, a second launch (~160) and the fp32
    partials written and read back (~3 per program-slice).

    B: batch; n_hblocks: programs per sequence (blocks of query rows);
    max_len: the longest sequence;
    n_sm: the GPU's SM count.

    >>> num_splits(1, 2, 16384, 132)
    ...     # one sequence, 128 heads: cut into slices
    >>> num_splits(128, 2, 16384, 132)  # a full batch fills the GPU: 1
    """
    progs = B * n_hblocks
    best, best_cost = 1, float("inf")
    for s in range(1, 129):
        per = math.ceil(max_len / s)
        if s > 1 and per < 64:
            break
        waves = math.ceil(progs * s / n_sm)
        cost = waves * (per + 64) + (0 if s == 1 else 160 + 3 * progs * s)
        if cost < best_cost:
            best, best_cost = s, cost
    return best


def splits_for(B: int, rows: int, max_len: int, device: torch.device) -> int:
    """`num_splits` for B sequences of `rows` = s_q * H query rows, the longest max_len positions, on
    `device` (its SM count on a GPU; off the GPU, PLAN_SM_COUNT, as an H200 would).

    >>> splits_for(1, 128, 16384, q.device)
    """
    n_sm = sm_count(device) if device.type == "cuda" else PLAN_SM_COUNT
    return num_splits(B, cdiv(rows, PLAN_HEAD_BLOCK), max_len, n_sm)


def gluon_misfit(q, kv_cache, block_table, head_dim_v):
    """Why the Gluon kernel cannot take this call (a phrase), or None if it
    can. The cache's layout is judged first (it is the same question on every
    machine), then the shapes, the GPU, the Triton, the dtype.

    q [B, s_q, H, D_qk]; kv_cache [B, T_max, D_qk], or [num_blocks,
    page_size, D_qk] with block_table.

    >>> gluon_misfit(q, kv_cache, None, 512)
    ...     # None on a Hopper GPU for bf16 DeepSeek shapes
    """
    B, S_Q, H, D_QK = q.shape
    page = gluon_decode.BN
    if block_table is not None:
        if kv_cache.shape[1] != page:
            return (f"its paged cache takes pages of {page} positions (one tile a page), "
                    f"got page size {kv_cache.shape[1]}")
        if kv_cache.stride(0) != page * kv_cache.stride(1):
            return (f"it reads the pages as one matrix of rows, so they must lie back to back "
                    f"(kv_cache.stride(0) == {page} * kv_cache.stride(1))")
        if kv_cache.shape[0] * page >= 2 ** 31:
            return "it addresses the cache's rows with 32-bit coordinates (num_blocks * 64 < 2**31)"
    if S_Q != 1 or D_QK != gluon_decode.D_QK or head_dim_v != gluon_decode.D_V or H % gluon_decode.BLOCK_H:
        return (f"it needs s_q = 1, D_qk = {gluon_decode.D_QK}, head_dim_v = {gluon_decode.D_V} and "
                f"H % {gluon_decode.BLOCK_H} == 0")
    if not is_hopper(q.device):
        return "it needs a Hopper GPU (sm_90)"
    if not fast_paths_on():
        return f"it was measured on Triton {', '.join(TESTED_TRITON)} only, and this is Triton {triton.__version__}"
    if q.dtype != torch.bfloat16:
        return f"it needs bfloat16, got {q.dtype}"
    if not tma_ready(kv_cache):
        return "it needs cache rows the copy engine can read (unit stride, 16-byte aligned base and strides)"
    return None


_WORKSPACES: dict = {}   # ((device, stream), (device, shape)) -> (ws_o, ws_lse); see workspace


def workspace(B, rows, num_splits, D_V, device, stream=None):
    """The split-KV partials, fp32 ws_o [B, rows, num_splits, D_V] and ws_lse [B, rows, num_splits], kept per
    stream and shape and reused on a GPU (`attention_kernels.launch.reused`; the last few shapes are kept: a B=8, H=128
    decode with 16 slices holds 34 MB); fresh elsewhere. stream: `attention_kernels.launch.launch_stream()`, where the
    caller has read it.

    >>> ws_o, ws_lse = workspace(4, 128, 8, 512, q.device)
    """
    shape = (B, rows, num_splits, D_V)

    def make():
        return (torch.empty(shape, device=device, dtype=torch.float32),
                torch.empty(shape[:3], device=device, dtype=torch.float32))
    return make() if device.type != "cuda" else reused(_WORKSPACES, (device, shape), make, stream=stream)


def dense_inputs(q, kv_cache, block_table, cache_seqlens):
    """The layouts the kernels read: q, the block table and the lengths dense, cache rows unit-stride
    (copies only where an input is strided that way; the cache's other strides are passed on). q is also
    copied when its base is not 16-byte aligned (a view that starts mid-row): the Gluon kernel reads it
    with the copy engine, which needs an aligned base. Returns the four in the same order.

    >>> q, kv_cache, block_table, cache_seqlens = dense_inputs(q, kv_cache, block_table, cache_seqlens)
    """
    if kv_cache.stride(-1) != 1:
        kv_cache = kv_cache.contiguous()
    block_table = None if block_table is None else block_table.contiguous()
    q = q.contiguous()
    if q.data_ptr() % 16:
        q = q.clone()
    return q, kv_cache, block_table, cache_seqlens.contiguous()


def plan_key(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, num_splits, backend):
    """Everything a call's checks and decisions read, as a dict key: each tensor's shape, strides, dtype, device,
    requires_grad and whether its address is 16-byte aligned, the grad mode, and the other arguments. None for
    a call that is not plainly ordinary (a tensor subclass, a scalar of another type, a tensor with no strides or
    address): the full path judges it every time. (The types matter: True == 1 == 1.0 as keys, not to the checks.)

    >>> plan_key(q, kv_cache, None, cache_seqlens, 512, None, False, None, "auto")
    """
    Tensor = torch.Tensor
    if not (type(q) is Tensor and type(kv_cache) is Tensor and type(cache_seqlens) is Tensor
            and (block_table is None or type(block_table) is Tensor) and type(head_dim_v) is int
            and (softmax_scale is None or type(softmax_scale) is float) and type(causal) is bool
            and (num_splits is None or type(num_splits) is int) and type(backend) is str):
        return None
    tensors = (q, kv_cache, cache_seqlens) if block_table is None else (q, kv_cache, cache_seqlens, block_table)
    try:
        signature = tuple([(t.shape, t.stride(), t.dtype, t.device, t.requires_grad, t.data_ptr() % 16 == 0)
                           for t in tensors])
    except RuntimeError:   # a sparse tensor, say: no address
        return None
    return signature, torch.is_grad_enabled(), head_dim_v, softmax_scale, causal, num_splits, backend


class Plan:
    """What the checks and decisions of one call came to (the kernel, the split, the scale, the shapes to
    allocate), kept for the next calls with its key (`plan_key`). Once a launch has gone straight to the C
    launcher (on a GPU), it also keeps the launches themselves (`attention_kernels.launch.relaunches`: the compiled
    kernels, their grids, their integer and float arguments), so that a later call allocates its output, reads
    the stream once and launches: no argument is checked or derived again.

    >>> plan = Plan(q, 512, 576 ** -0.5, False, 4, gluon=False, tma=True)
    >>> out, lse = plan(q, kv_cache, None, cache_seqlens)
    """

    def __init__(self, q, head_dim_v, softmax_scale, causal, num_splits, gluon, tma):
        B, S_Q, H, _ = q.shape
        self.device, self.dtype = q.device, q.dtype
        self.out_shape, self.lse_shape = (B, S_Q, H, head_dim_v), (B, H, S_Q)
        self.workspace_shape = (B, S_Q * H, num_splits, head_dim_v) if num_splits > 1 else None
        self.scale, self.causal, self.num_splits, self.gluon, self.tma = softmax_scale, causal, num_splits, gluon, tma
        self.relaunches = None   # after a first launch, where every launch was direct (never under the interpreter)

    def __call__(self, q, kv_cache, block_table, cache_seqlens):
        """out and lse for inputs in the layouts the kernels read (`dense_inputs`); kv_cache may be FlashMLA's 4D
        pages (the launch functions get the 3D view, a direct launch reads the same address)."""
        out = torch.empty(self.out_shape, device=self.device, dtype=self.dtype)
        lse = torch.empty(self.lse_shape, device=self.device, dtype=torch.float32)
        if self.relaunches is None or launch_hooked():   # (a profiler's hooks: Triton's own path, see DirectLaunch)
            self._launch(q, paged_rows(kv_cache, block_table), block_table, cache_seqlens, out, lse)
            return out, lse
        stream = launch_stream()
        tensors = (q, kv_cache, block_table, cache_seqlens, out, lse, *self._workspace(lse, stream))
        for relaunch in self.relaunches:
            relaunch(stream, tensors)
        return out, lse

    def _workspace(self, lse, stream=None):
        if self.workspace_shape is None:
            return lse, lse  # not read (fp32 pointers, as the workspace's: one compiled kernel for both)
        return workspace(*self.workspace_shape, self.device, stream)

    def _launch(self, q, kv_cache, block_table, cache_seqlens, out, lse):
        """Through the launch functions; where each of a first call's launches went straight to the C launcher,
        they are kept for the next calls."""
        ws_o, ws_lse = self._workspace(lse)
        if self.gluon:
            launched = [gluon_decode.launch_gluon(q, kv_cache, block_table, cache_seqlens, self.scale, out, lse,
                                                  ws_o, ws_lse, self.num_splits)]
        else:
            launched = [decode.launch_triton(q, kv_cache, block_table, cache_seqlens, self.scale, self.causal, out,
                                             lse, ws_o, ws_lse, self.num_splits, self.tma)]
        if self.num_splits > 1:  # each slice's partial output and lse, merged by the combine kernel
            launched.append(decode.launch_combine(ws_o, ws_lse, out, lse, self.num_splits))
        if self.relaunches is None:
            self.relaunches = relaunches(launched, (q, kv_cache, block_table, cache_seqlens, out, lse, ws_o, ws_lse))


def plan_decode(q, kv_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal, num_splits, backend,
                max_len) -> Plan:
    """The plan for a checked call whose inputs are in the layouts the kernels read (`dense_inputs`): the
    kernel (ValueError, saying why, for backend="gluon" where the Gluon kernel does not apply), how the Triton
    kernel reads the cache, and the split (num_splits, or `splits_for` the longest length max_len).

    >>> plan = plan_decode(q, kv_cache, None, cache_seqlens, 512, 576 ** -0.5, False, None, "auto", 8192)
    """
    misfit = None if backend == "triton" else gluon_misfit(q, kv_cache, block_table, head_dim_v)
    if backend == "gluon" and misfit is not None:
        raise ValueError(f"backend='gluon' does not apply here: {misfit}")
    tma = block_table is None and tma_ready(kv_cache)  # how the Triton kernel reads the cache
    if num_splits is None:
        num_splits = splits_for(q.shape[0], q.shape[1] * q.shape[2], max_len, q.device)
    return Plan(q, head_dim_v, softmax_scale, causal, num_splits, gluon=backend != "triton" and misfit is None,
                tma=tma)


_PLANS: dict = {}   # plan_key -> Plan
_MOST_PLANS = 256   # a server's decode steps come in many batch sizes, one plan each


def kept_plan(key) -> Plan | None:
    """The plan kept for `key` (`plan_key`; None finds none)."""
    return _PLANS.get(key)


def keep_plan(key, plan: Plan) -> None:
    """Keep `plan` for the calls with `key`; the oldest plan goes once _MOST_PLANS are kept."""
    while len(_PLANS) >= _MOST_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[key] = plan


__all__ = ["BACKENDS", "PLAN_HEAD_BLOCK", "PLAN_SM_COUNT", "num_splits", "splits_for", "gluon_misfit", "workspace",
           "dense_inputs", "plan_key", "Plan", "plan_decode", "kept_plan", "keep_plan"]
