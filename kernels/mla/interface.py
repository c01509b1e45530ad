"""The MLA decode entry points: check the inputs, choose the kernel and the split, allocate, launch.

Two kernels serve one contract (FlashMLA's). On a Hopper GPU the common serving case (bf16, one query
token, DeepSeek's 576/512 dims, a contiguous cache or FlashMLA's paged one with pages of 64 positions)
goes to the hand-scheduled Gluon kernel (`gluon_decode.py`, a copy warp and two ping-pong warpgroups), on
the Tritons it was measured on (`kernels.launch.TESTED_TRITON`); every other call to the Triton kernel
(`decode.py`). Both cut long sequences into slices when the batch is too small to fill the GPU (split-KV),
and share the kernel that merges the slices.

Host time: with check_seqlens=False a call reads nothing back from the GPU (the split is planned from the
cache's capacity, which the shapes give), reuses its split-KV workspace (`_workspace`), and launches the
compiled kernels directly after their first call (`gluon_decode.launch_gluon`, `decode.launch_combine`). Its
checks and decisions are made once per input signature (`_plan_key`: the tensors' shapes, strides, dtypes,
devices and alignment, and the other arguments) and kept as a `_Plan`, as FlashMLA keeps its scheduling metadata:
a later call with that signature only allocates its output and launches, and once the plan holds the compiled
kernels' launches (`kernels.launch.relaunches`), it reads the stream once and calls Triton's C launcher for each.
"""
from __future__ import annotations

import functools
import math

import torch
import triton

from ..checks import check_bool, check_choice, check_int, check_tensor
from ..launch import (TESTED_TRITON, _aligned, cdiv, fast_paths_on, is_hopper, launch_hooked, launch_stream, relaunches,
                      reused, sm_count, tma_ready)
from . import decode, gluon_decode
from .reference import cache_capacity, check_cache_lengths, check_decode_inputs, paged_rows

BACKENDS = ("auto", "triton", "gluon")
_BH_PLAN = 64   # the head block the split cost model assumes (both kernels' on the GPU)
_SM_PLAN = 132  # off the GPU (the interpreter), split as an H200 would


@functools.lru_cache(maxsize=1024)  # a decode loop asks the same question every step: answer it once
def _num_splits(B: int, n_hblocks: int, max_len: int, n_sm: int) -> int:
    """How many slices to cut each sequence into, by a small cost model in units of
    'one cache position processed by one program' (about 30 ns for 64 heads on an H200 SM):
    waves * (positions per slice + ~64 fixed per program), plus, when splitting, a
    second launch (~160) and the fp32 partials written and read back (~3 per program-slice)."""
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


def _gluon_misfit(q, kv_cache, block_table, head_dim_v):
    """Why the Gluon kernel cannot take this call (a phrase), or None if it can. The cache's layout is
    judged first (it is the same question on every machine), then the shapes, the GPU, the Triton, the dtype."""
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


_WORKSPACES: dict = {}   # ((device, stream), (device, shape)) -> (ws_o, ws_lse); see _workspace


def _workspace(B, rows, num_splits, D_V, device, stream=None):
    """The split-KV partials, fp32 ws_o [B, rows, num_splits, D_V] and ws_lse [B, rows, num_splits], kept per
    stream and shape and reused (`kernels.launch.reused`; the last few shapes are kept: a B=8, H=128 decode with
    16 slices holds 34 MB). stream: `kernels.launch.launch_stream()`, where the caller has read it."""
    shape = (B, rows, num_splits, D_V)

    def make():
        return (torch.empty(shape, device=device, dtype=torch.float32),
                torch.empty(shape[:3], device=device, dtype=torch.float32))
    return make() if device.type != "cuda" else reused(_WORKSPACES, (device, shape), make, stream=stream)


def _dense(q, kv_cache, cache_seqlens, block_table):
    """The layouts the kernels read: q, the lengths and the block table dense, cache rows unit-stride
    (copies only where an input is strided that way; the cache's other strides are passed on). q is also
    copied when its base is not 16-byte aligned (a view that starts mid-row): the Gluon kernel reads it
    with the copy engine, which needs an aligned base."""
    if kv_cache.stride(-1) != 1:
        kv_cache = kv_cache.contiguous()
    block_table = None if block_table is None else block_table.contiguous()
    q = q.contiguous()
    if not _aligned((q,)):
        q = q.clone()
    return q, kv_cache, cache_seqlens.contiguous(), block_table


def _plan_key(q, kv_cache, cache_seqlens, block_table, softmax_scale, head_dim_v, causal, num_splits, backend):
    """Everything a call's checks and decisions read, as a dict key: each tensor's shape, strides, dtype, device
    and whether its address is 16-byte aligned, and the other arguments. None for a call that is not plainly
    ordinary (a tensor subclass, a scalar of another type, a tensor with no strides or address): the full path
    judges it every time. (The types matter: True == 1 == 1.0 as keys, not to the checks.)"""
    Tensor = torch.Tensor
    if not (type(q) is Tensor and type(kv_cache) is Tensor and type(cache_seqlens) is Tensor
            and (block_table is None or type(block_table) is Tensor) and type(softmax_scale) is float
            and type(head_dim_v) is int and type(causal) is bool and (num_splits is None or type(num_splits) is int)
            and type(backend) is str):
        return None
    tensors = (q, kv_cache, cache_seqlens) if block_table is None else (q, kv_cache, cache_seqlens, block_table)
    try:
        signature = tuple([(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16 == 0) for t in tensors])
    except RuntimeError:   # a sparse tensor, say: no address
        return None
    return signature, softmax_scale, head_dim_v, causal, num_splits, backend


class _Plan:
    """What the checks and decisions of one call came to (the kernel, the split, the scale, the shapes to
    allocate), kept for the next calls with its key (`_plan_key`). Once a launch has gone straight to the C
    launcher (on a GPU), it also keeps the launches themselves (`kernels.launch.relaunches`: the compiled
    kernels, their grids, their integer and float arguments), so that a later call allocates its output, reads
    the stream once and launches: no argument is checked or derived again."""

    def __init__(self, q, D_V, scale, causal, num_splits, gluon, tma):
        B, S_Q, H, _ = q.shape
        self.device, self.dtype = q.device, q.dtype
        self.out_shape, self.lse_shape = (B, S_Q, H, D_V), (B, H, S_Q)
        self.workspace_shape = (B, S_Q * H, num_splits, D_V) if num_splits > 1 else None
        self.scale, self.causal, self.num_splits, self.gluon, self.tma = scale, causal, num_splits, gluon, tma
        self.relaunches = None   # after a first launch, where every launch was direct (never under the interpreter)

    def __call__(self, q, kv_cache, cache_seqlens, block_table):
        """out and lse for inputs in the layouts the kernels read (`_dense`); kv_cache may be FlashMLA's 4D pages
        (the launch functions get the 3D view, a direct launch reads the same address)."""
        out = torch.empty(self.out_shape, device=self.device, dtype=self.dtype)
        lse = torch.empty(self.lse_shape, device=self.device, dtype=torch.float32)
        if self.relaunches is None or launch_hooked():   # (a profiler's hooks: Triton's own path, see DirectLaunch)
            self._launch(q, paged_rows(kv_cache, block_table), cache_seqlens, block_table, out, lse)
            return out, lse
        stream = launch_stream()
        tensors = (q, kv_cache, cache_seqlens, block_table, out, lse, *self._workspace(lse, stream))
        for relaunch in self.relaunches:
            relaunch(stream, tensors)
        return out, lse

    def _workspace(self, lse, stream=None):
        if self.workspace_shape is None:
            return lse, lse  # not read (fp32 pointers, as the workspace's: one compiled kernel for both)
        return _workspace(*self.workspace_shape, self.device, stream)

    def _launch(self, q, kv_cache, cache_seqlens, block_table, out, lse):
        """Through the launch functions; where each of a first call's launches went straight to the C launcher,
        they are kept for the next calls."""
        ws_o, ws_lse = self._workspace(lse)
        if self.gluon:
            launched = [gluon_decode.launch_gluon(q, kv_cache, cache_seqlens, self.scale, out, lse, ws_o, ws_lse,
                                                  self.num_splits, block_table)]
        else:
            launched = [decode.launch_triton(q, kv_cache, block_table, cache_seqlens, self.scale, out, lse, ws_o,
                                             ws_lse, self.num_splits, self.causal, self.tma)]
        if self.num_splits > 1:  # each slice's partial output and lse, merged by the combine kernel
            launched.append(decode.launch_combine(ws_o, ws_lse, out, lse, self.num_splits))
        if self.relaunches is None:
            self.relaunches = relaunches(launched, (q, kv_cache, cache_seqlens, block_table, out, lse, ws_o, ws_lse))


_PLANS: dict = {}   # _plan_key -> _Plan
_MOST_PLANS = 256   # a server's decode steps come in many batch sizes, one plan each


def _remember(key, plan):
    while len(_PLANS) >= _MOST_PLANS:
        _PLANS.pop(next(iter(_PLANS)))   # the oldest
    _PLANS[key] = plan


def mla_decode(q, kv_cache, cache_seqlens, softmax_scale, head_dim_v=512, block_table=None, causal=False,
               *, num_splits=None, check_seqlens=True, backend="auto"):
    """MLA decode attention over a latent cache (absorbed form), FlashMLA's contract.

    q: [B, s_q, H, D_qk] (D_qk = 576 for DeepSeek: the absorbed 512 then the 64 RoPE dims), s_q >= 1.
    kv_cache: [B, T_max, D_qk]; or, with block_table (int32 [B, max_blocks]), a paged cache
        [num_blocks, page_size, D_qk], or FlashMLA's [num_blocks, page_size, 1, D_qk] (read as a view), where
        position t of sequence b is row t % page_size of page block_table[b, t // page_size]. Page slots
        past a sequence's length are never read (they may hold anything, NaN included).
        The value is the first head_dim_v columns of the cache (the latent c_kv).
    cache_seqlens: int32 [B], 1 <= seqlen <= capacity; positions past a sequence's length are never read.
    softmax_scale: required (DeepSeek-V3 with YaRN: ~0.1352; FlashMLA's default: 576 ** -0.5).
    causal: query i of s_q sees cache positions < seqlen - s_q + i + 1 (and nothing else reaches its row).
    num_splits: slices per sequence (split-KV); None picks from B, H, length and the SM count (the longest
        length when check_seqlens reads it, else the cache's capacity: no device sync).
    check_seqlens: validate seqlens / block table values (one device sync); False in graphs, timing loops and
        serving loops (then nothing is read back from the GPU, and a call like an earlier one, in its tensors'
        shapes, strides, dtypes, devices and alignment and in the other arguments, skips the checks and the
        choices: it launches as that call did; see the module docstring).
    backend: "auto" (the Gluon kernel where it applies, see the module docstring; else Triton), "triton",
        or "gluon" (ValueError, saying why, where it does not apply).
    dtypes: q and kv_cache of one dtype, bf16/fp16/fp32 on a CUDA GPU (fp32 products in TF32),
        fp16/fp32 on CPU tensors under Triton's interpreter. Strided inputs are fine (copied where the
        kernels need dense rows). A cache with 16-byte aligned rows is read with TMA (the copy engine bounds
        every tile by the sequence length), paged ones with pages of 64 in the Gluon kernel; other paged
        or unaligned caches with pointer loads.
    Returns out [B, s_q, H, head_dim_v] in q's dtype and lse fp32 [B, H, s_q] (natural log; NaN for a row
    that saw a NaN score, +inf for one that saw a +inf score).

    >>> q = torch.randn(4, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(4, 8192, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode(q, kv, torch.full((4,), 8192, dtype=torch.int32, device="cuda"), 576 ** -0.5)
    """
    # ---- a call like an earlier one, both with check_seqlens=False: checked and decided then, launch as it did
    key = None
    if check_seqlens is False:
        key = _plan_key(q, kv_cache, cache_seqlens, block_table, softmax_scale, head_dim_v, causal, num_splits, backend)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan(q, kv_cache, cache_seqlens, block_table)

    # ---- validate before any launch
    kv_cache = paged_rows(kv_cache, block_table)   # [num_blocks, page, 1, D_qk] -> [num_blocks, page, D_qk], a view
    scale = check_decode_inputs(q, kv_cache, cache_seqlens, softmax_scale, block_table, kernel=True)
    check_int("head_dim_v", head_dim_v, low=1, high=q.shape[-1])
    check_bool("causal", causal)
    check_int("num_splits", num_splits, low=1, allow_none=True)
    check_bool("check_seqlens", check_seqlens)
    check_choice("backend", backend, BACKENDS)
    B, S_Q, H, D_QK = q.shape
    D_V = head_dim_v
    max_len = cache_capacity(kv_cache, block_table)  # what the split plans for, unless the lengths are read
    if check_seqlens:
        max_len = check_cache_lengths(kv_cache, cache_seqlens, block_table, S_Q, causal)

    # ---- pick the kernel and the split
    given = (q, kv_cache, cache_seqlens, block_table)
    q, kv_cache, cache_seqlens, block_table = _dense(*given)
    misfit = None if backend == "triton" else _gluon_misfit(q, kv_cache, block_table, D_V)
    if backend == "gluon" and misfit is not None:
        raise ValueError(f"backend='gluon' does not apply here: {misfit}")
    gluon = backend != "triton" and misfit is None
    tma = block_table is None and tma_ready(kv_cache)  # how the Triton kernel reads the cache
    if num_splits is None:
        n_sm = sm_count(q.device) if q.device.type == "cuda" else _SM_PLAN
        num_splits = _num_splits(B, cdiv(S_Q * H, _BH_PLAN), max_len, n_sm)

    # ---- allocate, launch; the plan is kept for the calls like this one, where no input had to be copied
    plan = _Plan(q, D_V, scale, causal, num_splits, gluon, tma)
    out, lse = plan(q, kv_cache, cache_seqlens, block_table)
    if key is not None and all(now is before for now, before in zip((q, kv_cache, cache_seqlens, block_table), given)):
        _remember(key, plan)
    return out, lse


def mla_decode_gluon(q, kv_cache, cache_seqlens, softmax_scale, block_table=None):
    """MLA decode (absorbed form, s_q = 1, one pass per sequence) with the hand-scheduled Hopper kernel;
    see the module docstring. `mla_decode` calls it where it applies; call it directly only to time or
    test it.

    q bf16 [B, 1, H, 576] (H % 64 == 0); kv_cache bf16 [B, T_max, 576], rows 16-byte aligned, or with
    block_table (int32 [B, max_blocks]) pages of 64 positions, [num_blocks, 64, 576] or
    [num_blocks, 64, 1, 576], stored back to back. cache_seqlens int32 [B], each in [0, capacity] (not
    checked: that would cost a device sync; a dense cache clamps a longer one to T_max for the copies, so it
    cannot read outside its rows, but its result is then meaningless). softmax_scale: required. CUDA
    tensors on a Hopper GPU and a tested Triton (`kernels.launch.TESTED_TRITON`) only (ValueError elsewhere).
    Returns out bf16 [B, 1, H, 512] and lse fp32 [B, H, 1] (natural log; a sequence of length 0 gives out 0
    and lse -inf).

    >>> q = torch.randn(8, 1, 128, 576, device="cuda", dtype=torch.bfloat16)
    >>> kv = torch.randn(8, 4096, 576, device="cuda", dtype=torch.bfloat16)
    >>> out, lse = mla_decode_gluon(q, kv, torch.full((8,), 4096, dtype=torch.int32, device="cuda"), 0.1352)
    """
    kv_cache = paged_rows(kv_cache, block_table)
    scale = check_decode_inputs(q, kv_cache, cache_seqlens, softmax_scale, block_table, kernel=True)
    check_tensor("q", q, dtypes=(torch.bfloat16,))  # the one dtype this kernel takes
    q, kv_cache, cache_seqlens, block_table = _dense(q, kv_cache, cache_seqlens, block_table)
    misfit = _gluon_misfit(q, kv_cache, block_table, gluon_decode.D_V)
    if misfit is not None:
        raise ValueError(f"the Gluon kernel does not apply here: {misfit}")
    B, _, H, _ = q.shape
    out = torch.empty(B, 1, H, gluon_decode.D_V, device=q.device, dtype=q.dtype)
    lse = torch.empty(B, H, 1, device=q.device, dtype=torch.float32)
    gluon_decode.launch_gluon(q, kv_cache, cache_seqlens, scale, out, lse, None, None, 1, block_table)
    return out, lse


__all__ = ["mla_decode", "mla_decode_gluon"]
