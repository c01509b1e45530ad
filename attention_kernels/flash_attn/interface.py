"""The public entry points, dense and packed: input validation, the choice of forward kernel (Triton, or
on an sm_90 GPU the Gluon one where it measured faster) and of backward launch, and an autograd Function
around them."""
from __future__ import annotations

import functools
import numbers

import torch
import triton

from ..checks import (FLOATS, check_bool, check_choice, check_gradient, check_int, check_kernel_device, check_no_grad,
                      check_not_empty, check_once_per_signature, check_same_device, check_same_device_and_dtype,
                      check_tensor, softmax_scale_or_default)
from ..common import INTERPRET
from ..custom_ops import attention_bwd_fake, attention_fwd_fake, compiled_as_op
from ..launch import LN2  # the kernels keep the log-sum-exp in base 2; flash-attn returns it in natural log
from ..launch import TESTED_TRITON, capability, fast_paths_on
from . import backward, decode
from .forward import attention_fwd as triton_attention_fwd
from .reference import attention_flops, check_attention_args, check_varlen_args

BACKENDS = ("auto", "triton", "gluon")   # flash_attn_func's kernels, forward and backward: chosen, or forced

# The Gluon kernels against the Triton ones, TFLOP/s, on an H200 (bf16, B = 4, H = 32, D = 128, S = T, do_bench
# medians). Forward: `scripts/tune_probe.py fa_gluon`, notes/TUNING.md 2026-12-06 (19), the "NVIDIA H200" rows of
# results/logs/fa_gluon_forward.csv. Backward: `scripts/tune_probe.py fa_gluon_bwd` at commit 9d4e2e6,
# notes/TUNING.md 2026-12-07 (32), the rows of results/logs/fa_gluon_backward.csv with that code. `gluon_fwd_loop`
# and `gluon_bwd_form` read their verdicts from here: a new measurement updates these tables and nothing else.
# Forward: (T, causal) -> (Gluon in-order loop, Gluon overlapped loop, Gluon ping-pong loop, Triton).
GLUON_FWD_MEASURED = {
    (2048, False): (485, 506, 517, 423), (4096, False): (529, 525, 555, 471),
    (8192, False): (543, 582, 593, 490), (16384, False): (551, 595, 619, 498),
    (2048, True): (342, 343, 351, 356), (4096, True): (441, 424, 452, 422),
    (8192, True): (507, 466, 526, 456), (16384, True): (537, 563, 585, 478),
}
GLUON_FWD_LOOPS = ("in-order", "overlapped", "ping-pong")   # the Gluon columns of GLUON_FWD_MEASURED, in order
GLUON_FWD_HEAD_DIMS = (128,)   # the head dims measured; D = 64 runs too, but untimed it stays on Triton
# Backward: (T, causal) -> (Gluon dK/dV with the Triton dQ pass, Gluon dK/dV with the Gluon dQ kernel, Triton).
GLUON_BWD_MEASURED = {
    (512, False): (245, 242, 247), (1024, False): (341, 344, 300), (2048, False): (393, 404, 341),
    (4096, False): (423, 435, 367), (8192, False): (436, 459, 382), (16384, False): (451, 464, 379),
    (512, True): (138, 128, 142), (1024, True): (232, 223, 190), (2048, True): (317, 313, 268),
    (4096, True): (379, 386, 312), (8192, True): (421, 414, 346), (16384, True): (430, 455, 366),
}
GLUON_BWD_DQ = ("triton", "gluon")   # the dQ kernel of each Gluon column of GLUON_BWD_MEASURED, in order
GLUON_BWD_HEAD_DIMS = (128,)   # the head dims measured; D = 64 runs too, but untimed it stays on Triton


def _measured_point(table, T: int, S: int, causal: bool) -> tuple[int, bool]:
    """The key of `table` ((length, causal) -> timings) whose verdict a call of T queries and S keys takes: the
    longest measured length at or below it (below the shortest, the shortest); T != S (not measured) counts as
    the shorter of the two, which bounds both the query blocks and each block's key loop."""
    measured = sorted(t for t, c in table if c == causal)
    return max((t for t in measured if t <= min(T, S)), default=measured[0]), causal


def _fastest_gluon_column(table, names: tuple[str, ...], T: int, S: int, causal: bool) -> tuple[str, bool]:
    """Of a table of timings ((length, causal) -> Gluon columns, then Triton's), the Gluon column that measured
    fastest at the point T, S take (`_measured_point`), by its name in `names` (the Gluon columns', in order),
    and whether it beat Triton there."""
    *gluon, triton_ = table[_measured_point(table, T, S, causal)]
    fastest = max(range(len(gluon)), key=gluon.__getitem__)
    return names[fastest], gluon[fastest] > triton_


@functools.lru_cache(maxsize=256)   # asked on every dense call: a pure function of four ints
def gluon_fwd_loop(T: int, S: int, causal: bool, D: int) -> str | None:
    """The forward a dense call of T queries and S keys of head dim D should
    run, by the timings of GLUON_FWD_MEASURED: None for the Triton forward,
    else the fastest Gluon loop ("in-order", "overlapped" or "ping-pong")
    where it beat Triton. A length takes the verdict of the longest measured
    length at or below it (below the shortest, the shortest's); T != S counts
    as the shorter of the two. Unmeasured head dims: Triton.

    >>> gluon_fwd_loop(8192, 8192, False, 128)  # 'ping-pong'
    >>> gluon_fwd_loop(2048, 2048, True, 128)  # None: Triton measured faster
    """
    if D not in GLUON_FWD_HEAD_DIMS:
        return None
    loop, beats_triton = _fastest_gluon_column(GLUON_FWD_MEASURED, GLUON_FWD_LOOPS, T, S, causal)
    return loop if beats_triton else None


@functools.lru_cache(maxsize=256)
def gluon_bwd_form(T: int, S: int, causal: bool, D: int) -> str | None:
    """The backward a dense call of T queries and S keys of head dim D should run, by the timings of
    GLUON_BWD_MEASURED: None for the Triton backward, else the dQ kernel ("triton" or "gluon") beside the Gluon
    dK/dV kernel, of the Gluon form that measured fastest, where it beat Triton. Read at the point
    `gluon_fwd_loop` reads its own. Unmeasured head dims: Triton.

    >>> gluon_bwd_form(16384, 16384, True, 128)   # 'gluon'
    >>> gluon_bwd_form(8192, 8192, True, 128)     # 'triton'
    >>> gluon_bwd_form(512, 512, False, 128)      # None: Triton measured faster
    >>> gluon_bwd_form(8192, 8192, True, 64)      # None: not measured
    """
    if D not in GLUON_BWD_HEAD_DIMS:
        return None
    dq_kernel, beats_triton = _fastest_gluon_column(GLUON_BWD_MEASURED, GLUON_BWD_DQ, T, S, causal)
    return dq_kernel if beats_triton else None


@functools.lru_cache(maxsize=1)
def _gluon_forward():
    """The Gluon forward's module, or None where this Triton's Gluon does not import (its API moves between
    releases): imported on the first call that could run it, so that the Triton path never needs Gluon."""
    try:
        from . import gluon_forward
    except ImportError:
        return None
    return gluon_forward


@functools.lru_cache(maxsize=1)
def _gluon_backward():
    """The Gluon backward's module, or None where this Triton's Gluon does not import (as `_gluon_forward`)."""
    try:
        from . import gluon_backward
    except ImportError:
        return None
    return gluon_backward


def _gluon_platform_misfit(q, module) -> str | None:
    """Why no Gluon kernel runs here (a phrase), or None: an sm_90 GPU (not the interpreter), a Triton the fast
    paths were measured on, whose Gluon imports (`module`: the kernel's module, None where it did not)."""
    if INTERPRET or not q.is_cuda or capability(q.device) != (9, 0):
        return "it runs on an sm_90 GPU (H100, H200) only"
    if not fast_paths_on():
        return f"it was measured on Triton {', '.join(TESTED_TRITON)} only, and this is Triton {triton.__version__}"
    if module is None:
        return f"Gluon does not import in Triton {triton.__version__}"
    return None


def gluon_misfit(q, k, v) -> str | None:
    """Why this dense call cannot run the Gluon forward (a phrase), or None if it can: an sm_90 GPU (not the
    interpreter), a Triton the fast paths were measured on whose Gluon imports, and the inputs the kernel
    takes (`gluon_forward.gluon_forward_misfit`: bf16 or fp16, D 64 or 128, contiguous, aligned).

    >>> gluon_misfit(q, k, v)   # None on an H100 for bf16 [B, T, H, 128]
    """
    module = _gluon_forward()
    return _gluon_platform_misfit(q, module) or module.gluon_forward_misfit(q, k, v)


def gluon_bwd_misfit(do, q, k, v, o, lse) -> str | None:
    """Why this dense backward cannot run the Gluon one (a phrase), or None if it can: the platform as for the
    forward, and the inputs the kernel takes (`gluon_backward.gluon_backward_misfit`: bf16 or fp16, D 64 or
    128, contiguous, aligned)."""
    module = _gluon_backward()
    return _gluon_platform_misfit(q, module) or module.gluon_backward_misfit(do, q, k, v, o, lse)


def forward_kernel(q, k, v, causal: bool, backend: str) -> str | None:
    """Which forward a dense call runs: None for the Triton one, else the Gluon loop ("in-order", "overlapped" or
    "ping-pong"). backend "auto": Gluon where it fits (`gluon_misfit`) and measured faster (`gluon_fwd_loop`);
    "triton": always Triton; "gluon": Gluon, with the loop that measured fastest for the shape (in-order at an
    unmeasured head dim), ValueError saying why where it does not fit."""
    if backend == "triton":
        return None
    T, S, D = q.shape[1], k.shape[1], q.shape[3]
    if backend == "auto":
        loop = gluon_fwd_loop(T, S, causal, D)
        return loop if loop is not None and gluon_misfit(q, k, v) is None else None
    misfit = gluon_misfit(q, k, v)
    if misfit is not None:
        raise ValueError(f"backend='gluon' does not apply here: {misfit}")
    if D not in GLUON_FWD_HEAD_DIMS:
        return "in-order"
    return _fastest_gluon_column(GLUON_FWD_MEASURED, GLUON_FWD_LOOPS, T, S, causal)[0]


def backward_kernel(do, q, k, v, o, lse, causal: bool, backend: str) -> str | None:
    """Which backward a dense call runs: None for the Triton one, else the Gluon dK/dV kernel with the dQ kernel
    this names: "triton" (the Triton dQ pass) or "gluon" (the Gluon dQ kernel). backend as `forward_kernel`'s:
    "auto": the fastest of the three forms by the table (`gluon_bwd_form`), a Gluon one only where it fits
    (`gluon_bwd_misfit`); "triton": always Triton; "gluon": the Gluon form that measured faster for the shape
    (the Triton dQ pass at an unmeasured head dim), ValueError saying why where it does not fit."""
    if backend == "triton":
        return None
    T, S, D = q.shape[1], k.shape[1], q.shape[3]
    if backend == "auto":
        form = gluon_bwd_form(T, S, causal, D)
        return form if form is not None and gluon_bwd_misfit(do, q, k, v, o, lse) is None else None
    misfit = gluon_bwd_misfit(do, q, k, v, o, lse)
    if misfit is not None:
        raise ValueError(f"backend='gluon' does not apply here: {misfit}")
    if D not in GLUON_BWD_HEAD_DIMS:
        return "triton"
    return _fastest_gluon_column(GLUON_BWD_MEASURED, GLUON_BWD_DQ, T, S, causal)[0]


def _attention_fwd(q, k, v, causal: bool, softmax_scale: float, cu_seqlens_q=None, cu_seqlens_k=None,
                   backend: str = "auto"):
    """The forward launch (inputs validated and contiguous): (o like q, lse fp32 in base 2, [B, Hq, T] dense,
    [Hq, T] packed), from the kernel `forward_kernel` picks for a dense call, from the Triton one for packed
    sequences."""
    loop = None if cu_seqlens_q is not None else forward_kernel(q, k, v, causal, backend)
    if loop is None:
        return triton_attention_fwd(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k)
    gluon = _gluon_forward()
    schedule = {"in-order": gluon.IN_ORDER, "overlapped": gluon.OVERLAPPED, "ping-pong": gluon.PINGPONG}[loop]
    return gluon.launch_gluon(q, k, v, causal, softmax_scale, schedule.value)


# registered one level down, so that a compiled backward is FlashAttnFunction.backward, as in eager; the choice
# of kernel is inside the op, where the tensors are real (it reads their addresses' alignment)
attention_fwd = compiled_as_op("attention_kernels::attention_fwd", fake=attention_fwd_fake)(_attention_fwd)
# the decode launch as an op; the checks and the in-place append around it are traced as they are
decode_fwd = compiled_as_op("attention_kernels::attention_decode", fake=attention_fwd_fake)(decode.decode_fwd)


@compiled_as_op("attention_kernels::attention_bwd", fake=attention_bwd_fake)
def attention_bwd(do, q, k, v, o, lse, causal: bool, softmax_scale: float, one_launch: bool,
                  cu_seqlens_q=None, cu_seqlens_k=None, backend: str = "auto"):
    """The backward behind a check of everything it is given (`_check_backward_inputs`): the op is reachable on
    its own (torch.ops.attention_kernels.attention_bwd), and a tensor of the wrong shape would be read out of
    bounds. A dense call runs the kernel `backward_kernel` picks (the choice is inside the op, where the tensors
    are real), packed sequences `backward.attention_bwd`. The kernels derive strides from shapes: what is not
    contiguous is copied."""
    _check_backward_inputs(q, k, v, o, lse, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k)
    check_gradient("do", do, q.shape, q.dtype, q.device)
    do, q, k, v, o, lse = (t.contiguous() for t in (do, q, k, v, o, lse))
    dq_kernel = None if cu_seqlens_q is not None else backward_kernel(do, q, k, v, o, lse, causal, backend)
    if dq_kernel is not None:
        return _gluon_backward().gluon_attention_bwd(do, q, k, v, o, lse, causal, softmax_scale, dq_kernel=dq_kernel)
    return backward.attention_bwd(do, q, k, v, o, lse, causal, softmax_scale, one_launch, cu_seqlens_q, cu_seqlens_k)

SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)
SUPPORTED_DTYPES = FLOATS

# The backward runs as one launch instead of two below this many FLOPs (`attention_flops`). Why 32e9:
# it lies between the one size of the chapter's sweep (B = 1, H = 32, D = 128) where one launch measured
# faster on the H200, causal T = 1K (21 GFLOP, a GPU time as short as the host's for a Python autograd
# backward), and the next, non-causal 1K (43 GFLOP), where two launches were faster, as at every larger
# size (the dK/dV programs of one launch re-read O). The timings: the FlashAttention chapter, section 6.
ONE_LAUNCH_MAX_FLOPS = 32e9


def _validate(q, k, v, causal, softmax_scale) -> float:
    """Raise TypeError/ValueError naming the argument; return the softmax scale to use."""
    scale = check_attention_args(q, k, v, causal, softmax_scale, dtypes=SUPPORTED_DTYPES)
    check_kernel_device(q=q, k=k, v=v)
    check_choice("head dim D of q, k, v", q.shape[-1], SUPPORTED_HEAD_DIMS)
    return scale


def _check_forward_outputs(q, o, lse, lse_shape) -> None:
    """o as the forward returns it (q's shape and dtype) and its base-2 log-sum-exp, fp32 `lse_shape`, on q's
    device."""
    check_tensor("o", o, dtypes=(q.dtype,), shape=tuple(q.shape))
    check_tensor("lse", lse, dtypes=(torch.float32,), shape=lse_shape)
    check_same_device(q=q, o=o, lse=lse)


@check_once_per_signature
def _check_dense_backward(q, k, v, o, lse, causal, softmax_scale) -> None:
    _validate(q, k, v, causal, softmax_scale)
    B, T, HQ, _ = q.shape
    _check_forward_outputs(q, o, lse, (B, HQ, T))


def _check_backward_inputs(q, k, v, o, lse, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k) -> None:
    """What the backward op is given, by name: q, k, v, causal and the scale as the public functions check them
    (a dense call's verdict kept per signature; offsets on the CPU are read, so a packed call's is not), o and
    lse as the forward returns them."""
    if cu_seqlens_q is None:
        _check_dense_backward(q, k, v, o, lse, causal, softmax_scale)
        return
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, dtypes=SUPPORTED_DTYPES)
    check_kernel_device(q=q, k=k, v=v)
    check_choice("head dim D of q, k, v", q.shape[-1], SUPPORTED_HEAD_DIMS)
    T, HQ, _ = q.shape
    _check_forward_outputs(q, o, lse, (HQ, T))


def _one_launch(q, k, causal: bool, max_seqlen_k: int | None = None) -> bool:
    """Whether the backward is small enough to run as one launch (see ONE_LAUNCH_MAX_FLOPS). Packed
    sequences (max_seqlen_k given): counted as if every query saw max_seqlen_k keys, a bound."""
    if max_seqlen_k is None:
        B, T, HQ, D = q.shape
        S = k.shape[1]
    else:
        (T, HQ, D), B, S = q.shape, 1, max_seqlen_k
    return attention_flops(B, HQ, T, S, D, causal, backward=True) < ONE_LAUNCH_MAX_FLOPS


class FlashAttnFunction(torch.autograd.Function):
    """Forward: Triton FlashAttention-2, or for a dense call on an sm_90
    GPU the Gluon kernel where it measured faster (`forward_kernel`; both
    save O and the same fp32 base-2 log-sum-exp, not P), dense or packed
    (offsets given). Backward: `attention_bwd`, recomputing P: one Triton
    kernel, launched once or twice, or for a dense call on an sm_90 GPU the
    Gluon dK/dV kernel beside the Triton dQ pass or the Gluon dQ kernel,
    whichever form measured fastest (`backward_kernel`), whichever forward
    ran. With return_lse, the forward
    also returns the natural-log LSE, which takes no gradient."""

    @staticmethod
    def forward(ctx, q, k, v, causal, softmax_scale, return_lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_k, backend):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # the kernels derive strides from shapes
        cu_seqlens_k = cu_seqlens_q if cu_seqlens_k is None else cu_seqlens_k   # (see _attend)
        o, lse = attention_fwd(q, k, v, causal, softmax_scale, cu_seqlens_q, cu_seqlens_k, backend)
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.causal, ctx.softmax_scale, ctx.backend = causal, softmax_scale, backend
        ctx.one_launch = _one_launch(q, k, causal, max_seqlen_k)
        if not return_lse:
            return o
        lse = lse * LN2
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, *_):  # *_: the LSE's gradient (None) when the forward returned it
        q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.softmax_scale, ctx.one_launch,
                                   cu_seqlens_q, cu_seqlens_k, ctx.backend)
        return dq, dk, dv, None, None, None, None, None, None, None


def _attend(q, k, v, causal, scale, return_lse, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_k=None,
            backend="auto"):
    """Validated inputs to the kernels: through autograd when an input requires grad."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        # one offsets tensor for queries and keys goes in once (as None for the keys'): torch.compile
        # traces no autograd Function that takes a tensor twice
        shared = cu_seqlens_k is cu_seqlens_q
        return FlashAttnFunction.apply(q, k, v, causal, scale, return_lse, cu_seqlens_q,
                                       None if shared else cu_seqlens_k, max_seqlen_k, backend)
    # inference: skip autograd's bookkeeping (a few microseconds a call, which matter at short T)
    o, lse = attention_fwd(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale, cu_seqlens_q, cu_seqlens_k,
                           backend)
    return (o, lse * LN2) if return_lse else o


def _check_peer_options(causal, dropout_p, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                        return_lse, block_table=None) -> bool:
    """flash-attn's options beyond q, k, v, the offsets and the scale, as these kernels take them: the values
    that ask for nothing they lack pass, any other is refused naming the argument. Returns causal, which
    window_size (-1, 0) also asks for (see `flash_attn_func`)."""
    if (type(dropout_p) is float and dropout_p == 0.0 and type(window_size) is tuple and window_size == (-1, -1)
            and type(window_size[0]) is type(window_size[1]) is int and type(softcap) is float and softcap == 0.0
            and alibi_slopes is None and block_table is None and type(causal) is bool
            and type(deterministic) is bool and return_attn_probs is False and type(return_lse) is bool):
        return causal   # flash-attn's defaults: nothing to check one by one (a few microseconds of a short call)
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0: these kernels have no dropout, got {dropout_p}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    left, right = (check_int(f"window_size[{i}]", w) for i, w in enumerate(window_size))
    if left >= 0 or right > 0:
        raise ValueError(f"window_size must be (-1, -1) (no window) or (-1, 0) (the causal mask): these kernels "
                         f"have no sliding window, got {tuple(window_size)}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap > 0:
        raise ValueError(f"softcap must be 0.0 (off): these kernels do not cap the scores, got {softcap}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes must be None: these kernels add no ALiBi bias")
    if block_table is not None:
        raise ValueError("block_table must be None: this packed form reads k and v unpaged")
    check_bool("causal", causal)
    check_bool("deterministic", deterministic)
    check_bool("return_attn_probs", return_attn_probs)
    check_bool("return_lse", return_lse)
    if return_attn_probs and return_lse:
        raise ValueError("return_attn_probs and return_lse ask for two shapes of one result: pass one of them")
    return causal or right == 0


def _outputs(result, return_attn_probs: bool):
    """flash-attn's return_attn_probs=True shape, (o, lse, None): no probabilities are ever formed here."""
    return (*result, None) if return_attn_probs else result


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, *, return_lse=False,
                    backend="auto"):
    """FlashAttention-2 (Triton; on an sm_90 GPU the forward and the
    backward's dK/dV in Gluon where they measured faster), GQA-aware,
    differentiable; flash-attn's arguments, in its order.

    q: [B, T, Hq, D]; k, v: [B, S, Hkv, D], Hq a multiple of Hkv (MHA, GQA,
    MQA); query head h reads KV head h // (Hq // Hkv). D in (32, 64, 128,
    256); fp16 or bf16 on a GPU, fp32 too (TF32 dots on a GPU; exact under
    the interpreter, which takes CPU tensors and no bf16). Every size >= 1.
    causal=True masks bottom-right aligned (flash-attn >= 2.1): query i sees
    key j iff j <= i + S - T; rows that see no key output 0, and a NaN or inf
    at a key a row cannot see does not reach that row. softmax_scale defaults
    to 1/sqrt(D). Returns o: [B, T, Hq, D] in q's dtype. Non-contiguous
    inputs (e.g. a transposed [B, H, T, D] view) are copied to contiguous
    first.

    flash-attn's other options, taken where they ask for what these kernels
    do and refused (ValueError naming the argument) where they ask for more:
    dropout_p 0.0 only (no dropout); window_size: a negative entry means no
    limit on that side, so (-1, -1) is no window and (-1, 0) the causal mask
    (the same as causal=True), any other window is refused (no sliding
    window); softcap <= 0 (off, as in flash-attn), no cap > 0; alibi_slopes
    None only; deterministic: any bool, since the backward is deterministic
    either way (it sums a KV head's query heads in one program, without
    atomics). return_attn_probs=True returns (o, lse, None): lse as below,
    and None where flash-attn returns its softmax-and-dropout matrix, which
    these kernels never form. return_lse=True (keyword only, not
    flash-attn's) returns (o, lse): lse = log sum_j exp(s_ij * scale) per
    row, fp32 [B, Hq, T], natural log, +inf on a row that sees no key, not
    differentiable; flash-attn hands out the same tensor as softmax_lse, the
    second of return_attn_probs's three outputs. Not both.

    backend (keyword only, not flash-attn's): the kernels, forward and
    backward. "auto" (the default): on an sm_90 GPU (H100, H200), bf16 or
    fp16, D 64 or 128, the warp-specialized Gluon kernels where they
    measured faster than the Triton ones (`gluon_fwd_loop`; the backward's
    dQ from Triton's pass or Gluon's kernel, `gluon_bwd_form`), else
    Triton; "triton": always Triton; "gluon": always Gluon (the faster
    Gluon form), ValueError saying why where it cannot run.

    >>> q = torch.randn(2, 1000, 32, 128, device="cuda",
    ...                 dtype=torch.bfloat16, requires_grad=True)
    >>> k, v = (torch.randn(2, 1000, 8, 128, device="cuda",
    ...                     dtype=torch.bfloat16) for _ in "kv")
    >>> flash_attn_func(q, k, v, causal=True).sum().backward()
    ...     # q.grad: [2, 1000, 32, 128]
    >>> o = flash_attn_func(q, k, v, 0.0, None, True)
    ...     # flash-attn's positions: the same call
    """
    causal = _check_peer_options(causal, dropout_p, window_size, softcap, alibi_slopes, deterministic,
                                 return_attn_probs, return_lse)
    check_choice("backend", backend, BACKENDS)
    scale = _validate(q, k, v, causal, softmax_scale)
    return _outputs(_attend(q, k, v, causal, scale, return_lse or return_attn_probs, backend=backend),
                    return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None, *, return_lse=False):
    """FlashAttention-2 (Triton) on packed sequences, GQA-aware, differentiable; flash-attn's arguments, in
    its order.

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D] hold N sequences one after another, without padding;
    cu_seqlens_q, cu_seqlens_k: int32 [N + 1] offsets on q's device (0 first, the packed length last):
    sequence n is q[cu_seqlens_q[n]:cu_seqlens_q[n + 1]] against k and v rows cu_seqlens_k[n] to
    cu_seqlens_k[n + 1], and sees nothing of the others. A length may be 0 (an empty query sequence
    outputs nothing, an empty key sequence outputs 0). max_seqlen_q, max_seqlen_k: ints >= 1, the longest
    lengths, as flash-attn takes them; here each program finds its sequence from the offsets on the GPU,
    and max_seqlen_k only bounds the work when choosing the backward's launch. causal=True masks
    bottom-right aligned within each sequence (query i of T_n sees key j of S_n iff j <= i + S_n - T_n),
    as flash-attn does. Heads, head dims, dtypes, devices and softmax_scale as `flash_attn_func`; so are
    dropout_p, window_size, softcap, alibi_slopes, deterministic and return_attn_probs. block_table (a
    paged KV cache) must be None. Offsets on the CPU (the interpreter) are checked in full; on a GPU only
    their dtype, shape and device, since reading them would wait. Returns o: [total_q, Hq, D] in q's
    dtype; with return_lse=True (keyword only) (o, lse), with return_attn_probs=True (o, lse, None), lse
    fp32 [Hq, total_q] in natural log (flash-attn's softmax_lse), not differentiable.

    >>> cu = torch.tensor([0, 300, 2300, 2400], device="cuda", dtype=torch.int32)   # lengths 300, 2000, 100
    >>> q, k, v = (torch.randn(2400, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "qkv")
    >>> o = flash_attn_varlen_func(q, k, v, cu, cu, 2000, 2000, causal=True)    # [2400, 8, 128]
    """
    causal = _check_peer_options(causal, dropout_p, window_size, softcap, alibi_slopes, deterministic,
                                 return_attn_probs, return_lse, block_table)
    scale = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, softmax_scale, dtypes=SUPPORTED_DTYPES)
    check_kernel_device(q=q, k=k, v=v)
    check_choice("head dim D of q, k, v", q.shape[-1], SUPPORTED_HEAD_DIMS)
    check_int("max_seqlen_q", max_seqlen_q, low=1)
    check_int("max_seqlen_k", max_seqlen_k, low=1)
    result = _attend(q, k, v, causal, scale, return_lse or return_attn_probs, cu_seqlens_q.contiguous(),
                     cu_seqlens_k.contiguous(), max_seqlen_k)
    return _outputs(result, return_attn_probs)


def _check_cache_options(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table, window_size, softcap,
                         rotary_interleaved, alibi_slopes, num_splits, causal, return_softmax_lse) -> None:
    """flash_attn_with_kvcache's options this decode kernel does not have, refused naming the argument
    where they ask for something (their defaults pass)."""
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("cache_batch_idx", cache_batch_idx),
                        ("cache_leftpad", cache_leftpad), ("block_table", block_table),
                        ("alibi_slopes", alibi_slopes)):
        if value is not None:
            raise ValueError(f"{name} must be None: this decode kernel has no {_MISSING[name]}")
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair (left, right) of ints, got {window_size!r}")
    if any(check_int(f"window_size[{i}]", w) >= 0 for i, w in enumerate(window_size)):
        raise ValueError(f"window_size must be (-1, -1): this decode kernel has no sliding window, got "
                         f"{tuple(window_size)}")
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap != 0:
        raise ValueError(f"softcap must be 0.0 (off): this decode kernel does not cap the scores, got {softcap}")
    check_bool("rotary_interleaved", rotary_interleaved)  # read only with rotary_cos, which is refused
    check_int("num_splits", num_splits, low=0)
    check_bool("causal", causal)
    check_bool("return_softmax_lse", return_softmax_lse)


_MISSING = {"rotary_cos": "rotary embedding", "rotary_sin": "rotary embedding",
            "cache_batch_idx": "cache rows chosen per batch element", "cache_leftpad": "left padding",
            "block_table": "paged cache", "alibi_slopes": "ALiBi bias"}


def _check_cache_args(q, k_cache, v_cache, k, v, cache_seqlens):
    """The tensors of flash_attn_with_kvcache: TypeError/ValueError naming the argument. Returns the
    number of new tokens (0 without k and v)."""
    check_no_grad("flash_attn_with_kvcache", q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, ndim=4, dtypes=SUPPORTED_DTYPES)
    check_same_device_and_dtype(q=q, k_cache=k_cache, v_cache=v_cache)
    check_kernel_device(q=q, k_cache=k_cache, v_cache=v_cache)
    check_not_empty("q", q, "B, S_q, Hq, D")
    check_not_empty("k_cache", k_cache, "B, T_cache, Hkv, D")
    B, _, HQ, D = q.shape
    check_tensor("k_cache", k_cache, shape=(B, None, None, D))  # q's batch and head dim
    check_tensor("v_cache", v_cache, shape=tuple(k_cache.shape))
    HKV = k_cache.shape[2]
    if HQ % HKV:
        raise ValueError(f"q's heads Hq={HQ} must be a multiple of k_cache's and v_cache's heads Hkv={HKV}")
    check_choice("head dim D of q, k_cache, v_cache", D, SUPPORTED_HEAD_DIMS)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got stride {t.stride(-1)}: "
                             "the cache is written in place, so it is not copied")
    new = 0
    if (k is None) != (v is None):
        raise ValueError("k and v are the new tokens' keys and values: pass both or neither")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            check_tensor(name, t, ndim=4, dtypes=SUPPORTED_DTYPES)
        check_same_device_and_dtype(q=q, k=k, v=v)
        check_kernel_device(k=k, v=v)
        check_not_empty("k", k, "B, S_new, Hkv, D")
        check_tensor("k", k, shape=(B, None, HKV, D))
        check_tensor("v", v, shape=tuple(k.shape))
        new = k.shape[1]
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required with k and v: it says where the new tokens go")
    T_cache = k_cache.shape[1]
    if isinstance(cache_seqlens, torch.Tensor):
        check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=(torch.int32,), shape=(B,))
        if cache_seqlens.device != q.device:
            raise ValueError(f"cache_seqlens is on {cache_seqlens.device}, q on {q.device}: they must share a device")
        if cache_seqlens.device.type == "cpu" and not torch.compiler.is_compiling():  # values read on the CPU only
            low, high = int(cache_seqlens.min()), int(cache_seqlens.max())
            if low < 0 or high + new > T_cache:
                raise ValueError(f"cache_seqlens must be in [0, T_cache - S_new] = [0, {T_cache - new}] (the cache "
                                 f"holds {T_cache} positions, {new} new ones go after each length), got {low}..{high}")
    elif cache_seqlens is not None:
        check_int("cache_seqlens", cache_seqlens, low=0, high=T_cache - new)
    return new


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention of a few new query tokens against a KV cache (decoding), GQA-aware, forward only;
    flash-attn's arguments, in its order. The split-KV kernel of `decode.py`: one program per (batch, KV
    head, slice of the cache) with the group's query heads as its rows.

    q: [B, S_q, Hq, D]; k_cache, v_cache: [B, T_cache, Hkv, D] with a unit-stride last dim (other strides
    free: a view into a larger buffer is read in place), Hq a multiple of Hkv; D in (32, 64, 128, 256);
    fp16 or bf16 on a GPU, fp32 too (TF32 dots on a GPU; exact under the interpreter, which takes CPU tensors
    and no bf16). cache_seqlens: int32 [B] on q's device, or an int for every sequence, or None for the whole cache:
    sequence b's cache holds cache_seqlens[b] tokens. k, v: [B, S_new, Hkv, D], the new tokens' keys and
    values, written into the caches in place at positions cache_seqlens[b] ... + S_new - 1 before the
    attention, which then covers cache_seqlens[b] + S_new keys (cache_seqlens itself is not changed).
    causal=True: query i sees key j iff j <= i + S - S_q (bottom-right aligned, S the keys attended to);
    a row that sees no key outputs 0. softmax_scale defaults to 1/sqrt(D). Lengths on the CPU are checked
    against T_cache; on a GPU they are not read (that would wait for the device): a length past the cache
    is the caller's error, as in flash-attn. num_splits: how many slices to cut each sequence into; 0 (the
    default) chooses from the batch, the heads and the GPU's SM count (`decode.decode_splits`).

    Returns o: [B, S_q, Hq, D] in q's dtype; with return_softmax_lse=True, (o, lse): lse fp32 [B, Hq, S_q],
    log sum_j exp(s_ij * scale) in natural log, -inf on a row that sees no key (flash-attn returns +inf
    there). Forward only: an input that requires grad is refused (ValueError naming it) while grad mode is
    on. rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table and alibi_slopes must be None,
    window_size (-1, -1) and softcap 0.0 (ValueError naming the argument otherwise): no rotary embedding,
    cache indirection, paging, bias, window or cap here.

    >>> q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> k_cache, v_cache = (torch.zeros(4, 8192, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    >>> k_new, v_new = (torch.randn(4, 1, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in "kv")
    >>> lens = torch.tensor([100, 4000, 1, 8000], device="cuda", dtype=torch.int32)
    >>> o = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lens)   # [4, 1, 32, 128]
    """
    _check_cache_options(rotary_cos, rotary_sin, cache_batch_idx, cache_leftpad, block_table, window_size, softcap,
                         rotary_interleaved, alibi_slopes, num_splits, causal, return_softmax_lse)
    new = _check_cache_args(q, k_cache, v_cache, k, v, cache_seqlens)
    scale = softmax_scale_or_default(softmax_scale, q.shape[-1])
    B, T_cache = k_cache.shape[:2]
    if cache_seqlens is None:
        lengths = torch.full((B,), T_cache, device=q.device, dtype=torch.int32)
    elif isinstance(cache_seqlens, torch.Tensor):
        lengths = cache_seqlens.contiguous()
    else:
        lengths = torch.full((B,), cache_seqlens, device=q.device, dtype=torch.int32)
    if new:  # the new tokens into the caches, at each sequence's own length: no length is read on the host
        rows = torch.arange(B, device=q.device)[:, None]
        positions = lengths[:, None].long() + torch.arange(new, device=q.device)
        k_cache[rows, positions] = k
        v_cache[rows, positions] = v
        lengths = lengths + new
    if num_splits == 0:
        longest = T_cache if cache_seqlens is None or isinstance(cache_seqlens, torch.Tensor) else cache_seqlens + new
        num_splits = decode.decode_splits(B, k_cache.shape[2], q.shape[1], q.shape[2] // k_cache.shape[2], longest,
                                          q.device)
    o, lse = decode_fwd(q.contiguous(), k_cache, v_cache, lengths, causal, scale, num_splits)
    return (o, lse) if return_softmax_lse else o
