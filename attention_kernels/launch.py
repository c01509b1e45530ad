"""What every family's launch code shares: constants, tile choice on each machine, device facts,
the direct-launch fast paths (on the Tritons they were measured on), and the scratch memory TMA descriptors need.

    >>> configs = autotune_configs([({"BV": 64}, 4, 2), ({"BV": 32}, 8, 3)], interpreter={"BV": 32})
    >>> n_sm = sm_count(q.device)
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from typing import NamedTuple

import torch
import triton
from triton import knobs
from triton.runtime.driver import driver
from triton.runtime.errors import OutOfResources

from .common import INTERPRET

LOG2E = math.log2(math.e)  # exp(x) = exp2(x * LOG2E): kernels fold it into the scale and use exp2
LN2 = math.log(2.0)        # a base-2 log-sum-exp times LN2 is the natural one


# ------------------------------------------------------------------ the Tritons the fast paths were measured on
# The direct launches below call Triton's C launcher and read its compiled kernels' internals, and the Gluon
# kernels (MLA's decode, FlashAttention's forward) are written in Triton's experimental Gluon language: both change
# between releases. One edit extends them.
TESTED_TRITON = ("3.6",)   # releases, major.minor
_untested_warned = False   # set by the first warning, so that a process warns once


def triton_tested() -> bool:
    """Whether the installed Triton is one of the releases in TESTED_TRITON."""
    return ".".join(triton.__version__.split(".")[:2]) in TESTED_TRITON


def fast_paths_on() -> bool:
    """Whether to take the paths measured on the tested Tritons only: `launch`'s and `launch_direct`'s direct
    launches and the Gluon kernels (MLA's decode, `attention_kernels.mla`; FlashAttention's forward,
    `attention_kernels.flash_attn`). On another Triton they step aside for the plain `kernel[grid](...)` launch and
    the Triton kernels, and the first call that finds so warns, once per process."""
    if triton_tested():
        return True
    global _untested_warned
    if not _untested_warned:
        _untested_warned = True
        warnings.warn(f"Triton {triton.__version__} is not a release the book's fast paths were measured on "
                      f"({', '.join(TESTED_TRITON)}): direct launches and the Gluon kernels are off", stacklevel=2)
    return False


# ------------------------------------------------------------------ tiles on each machine
def on_machine(gpu, interpreter):
    """`interpreter` under Triton's interpreter (it runs one program at a time: small tiles, few
    steps), `gpu` elsewhere. For tile tuples, config lists, anything."""
    return interpreter if INTERPRET else gpu


def autotune_configs(space, interpreter: dict | None = None):
    """triton.Config list from (meta-parameters, num_warps, num_stages)
    triples. Under the interpreter one config only: `interpreter`'s
    meta-parameters, or the first triple's."""
    if INTERPRET:
        return [triton.Config(space[0][0] if interpreter is None else interpreter, num_warps=4)]
    return [triton.Config(kw, num_warps=w, num_stages=s) for kw, w, s in space]


# Host-side arithmetic for the launchers, in plain Python. Triton 3.6 makes `triton.cdiv` and
# `triton.next_power_of_2` constexpr functions, usable inside kernels too, and each call from Python pays about
# 2 us of wrapping: that counts in a decode step, whose whole host time is tens of microseconds.
def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def pow2_at_least_16(n: int) -> int:
    """The block that covers n: a power of two, and >= 16 (the smallest side `tl.dot` takes)."""
    return max(16, next_power_of_2(n))


# ------------------------------------------------------------------ device facts, asked once
@functools.lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H200)."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def capability(device: torch.device) -> tuple[int, int]:
    """(major, minor) compute capability; (9, 0) is Hopper."""
    return torch.cuda.get_device_capability(device)


def is_hopper(device: torch.device) -> bool:
    return not INTERPRET and device.type == "cuda" and capability(device)[0] == 9


def tma_ready(t: torch.Tensor) -> bool:
    """Whether the copy engine (TMA) can read `t` as rows: unit stride inside a row, and a 16-byte
    aligned base and row strides."""
    esz = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(s * esz % 16 == 0 for s in t.stride()[:-1])


# ------------------------------------------------------------------ scratch for device-made TMA descriptors
def _torch_scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


@contextlib.contextmanager
def tma_scratch():
    """Within: kernels that make TMA descriptors on the device (`tl.make_tensor_descriptor`) get their
    few bytes of global scratch from PyTorch's allocator. The allocator is Triton's context variable:
    it is set for the launch and restored after, and one the caller installed is left alone."""
    from triton.runtime import _allocation

    if _allocation._allocator.get() is not _allocation._NULL_ALLOCATOR:
        yield
        return
    token = _allocation._allocator.set(_torch_scratch)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


# ------------------------------------------------------------------ straight to Triton's C launcher
def current_stream() -> tuple[int, int]:
    """(device index, stream handle): the current CUDA device and its current stream, as Triton's launcher
    takes them (no Stream object made). Kernels launch on the current device, as Triton's own launches do."""
    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


def launch_stream():
    """`current_stream()`, or None while a CUDA graph capture is under way on the current stream (a graph owns its
    memory: see `reused`). A call that launches several kernels reads it once and hands it to each."""
    return None if torch.cuda.is_current_stream_capturing() else current_stream()


def reused(kept: dict, key, make, most: int = 4, stream=None):
    """`make()`, made once per `key` and current CUDA stream and then reused by the calls on that stream: launches
    on one stream run in order, so a later one cannot overwrite what an earlier one still reads. `kept` holds the
    `most` most recently used. Inside a CUDA graph capture it is made afresh, so that the graph owns its own.
    stream: `launch_stream()`, where the caller has read it already; None reads it here."""
    if stream is None:
        stream = launch_stream()
        if stream is None:
            return make()
    key = (stream, key)
    value = kept.pop(key, None)
    if value is None:
        value = make()
        while len(kept) >= most:
            kept.pop(next(iter(kept)))   # the least recently used
    kept[key] = value
    return value


def _hooked(chain) -> bool:
    """Whether a launch hook is installed (Triton 3.6 keeps them in a chain, empty unless a profiler adds one)."""
    return chain is not None and bool(getattr(chain, "calls", True))


def launch_hooked() -> bool:
    """Whether a profiler has installed a launch hook: launches then go through Triton's own path, which calls it."""
    return _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)


class DirectLaunch:
    """One compiled kernel, launched through Triton's C launcher and nothing else: `direct(grid, *args)` with the
    arguments a launch of the JIT function takes, constexprs left out (they are given once, here).

    A decode step at B = 1 is about 30 us of GPU work, so every microsecond of host time shows in a plain call.
    `compiled[grid](*args)` spends 5-10 us before the C launcher runs: it asks Triton's driver for the device and
    the stream, builds launch metadata and a closure, and for a kernel that makes TMA descriptors on the device it
    asks the allocator for their scratch, which `tma_scratch` makes a PyTorch allocation. Here the stream is read
    directly and the scratch is kept per stream and reused (`reused`). A profiler's launch hooks, and a kernel
    compiled with a profiler's instrumentation (`instrumented`), get Triton's own path."""

    def __init__(self, compiled, constexprs):
        compiled._init_handles()
        runner = compiled.run  # Triton's CudaLauncher: its C launch function and the kernel's launch attributes
        self._compiled, self._constexprs = compiled, tuple(constexprs)
        self._launch = runner.launch
        self._head = (compiled.function, runner.launch_cooperative_grid, runner.launch_pdl)
        self._metadata = compiled.packed_metadata
        self._scratch_bytes = runner.global_scratch_size * runner.num_ctas  # per CTA
        self.instrumented = runner.profile_scratch_size > 0
        self._scratch = {}  # (stream, size) -> the kept scratch

    def __call__(self, grid, *args):
        if self.instrumented or launch_hooked():
            with tma_scratch():
                self._compiled[grid](*args, *self._constexprs)
            return
        self.on(launch_stream(), grid, args)

    def on(self, stream, grid, args):
        """The launch through the C launcher, on `stream` (`launch_stream()`, read once by a caller that launches
        several kernels; None inside a graph capture), for a caller that has asked `launch_hooked()` and
        `instrumented` first."""
        grid = (*grid, 1, 1)[:3]   # the C launcher takes three grid dims; a launch may give one or two
        scratch = None
        if self._scratch_bytes:
            size = grid[0] * grid[1] * grid[2] * self._scratch_bytes
            scratch = reused(self._scratch, size, lambda: torch.empty(size, dtype=torch.int8, device="cuda"),
                             stream=stream)
        self._launch(*grid, (stream or current_stream())[1], *self._head, scratch, None, self._metadata, None, None,
                     None, *args, *self._constexprs)


class Launched(NamedTuple):
    """A launch `launch_direct` made, to be made again (`relaunches`): the compiled kernel, the grid, the arguments."""
    direct: DirectLaunch
    grid: tuple
    args: tuple


_DIRECT = {}  # (kernel, key) -> DirectLaunch


def launch_direct(kernel, grid, key, args, constexprs, aligned=True, **options) -> Launched | None:
    """`kernel[grid](*args, **constexprs, **options)`, and after the first call with `key`, the compiled kernel
    through `DirectLaunch`, skipping Triton's dispatcher, which re-derives every argument's specialization on each
    call. For kernels that specialize on nothing `key` leaves out but their pointers' 16-byte alignment: every
    integer argument do_not_specialize (floats never are), and `key` naming the constexprs and the pointers'
    dtypes. aligned: whether the pointers are 16-byte aligned, as they were when the kernel was compiled (a call
    that is not goes through the dispatcher). The kernel's TMA descriptors, if it makes any on the device, get
    their scratch from `tma_scratch` on that path. Returns the launch (`Launched`) where its compiled kernel can be
    launched directly from now on, else None (under the interpreter, which compiles nothing, unaligned, or on a
    Triton other than the tested ones: `fast_paths_on`)."""
    direct = _DIRECT.get((kernel, key)) if aligned else None
    if direct is not None:
        direct(grid, *args)
        return Launched(direct, grid, args)
    with tma_scratch():
        compiled = kernel[grid](*args, **constexprs, **options)
    if compiled is None or not aligned or not fast_paths_on():  # (the interpreter compiles nothing)
        return None
    values = {**constexprs, **options}   # the compiled kernel takes its constexprs in signature order
    direct = _DIRECT[(kernel, key)] = DirectLaunch(compiled, [values[name] for name in kernel.arg_names[len(args):]])
    return Launched(direct, grid, args)


# ------------------------------------------------------------------ tile candidates, launched directly
_CHOSEN = {}  # key -> index of the first candidate that fits


def aligned16(args) -> bool:
    """Whether every tensor among `args` starts at a 16-byte aligned address, as the direct launches need: Triton
    compiles that alignment into a kernel, and a call that lacks it goes through the dispatcher."""
    return all(a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor))


def launch(kernel, grid, candidates, key, *args, **constexprs) -> Launched | None:
    """Launch `kernel` with the first of `candidates` (BM, BN, num_warps,
    num_stages) that fits in this GPU's shared memory (BM: query rows per
    tile, BN: keys per tile, in every kernel). `grid(BM, BN)` gives the
    launch grid; `key` names the compiled variant (device, dtype and the
    constexprs), so a candidate that does not fit is compiled and rejected
    once, not on every call.

    After the first call, a key's compiled kernel is launched directly
    (`launch_direct`). Triton's dispatcher re-derives every argument's
    specialisation on each call: about 20 us of host time per launch with 15
    arguments on the H200's CPU, and at short lengths that host time is what
    bounds a call. Skipping the dispatcher is safe for kernels that
    specialise on nothing that changes between calls with one key: lengths
    are `do_not_specialize`, floats are never specialised, and pointers are
    checked to be 16-byte aligned, as they were when the kernel was compiled.
    Under the interpreter, and on a Triton other than the tested ones
    (`fast_paths_on`), every call goes through the dispatcher. Returns
    `launch_direct`'s result."""
    i, aligned = _CHOSEN.get(key, 0), aligned16(args)
    while True:
        bm, bn, warps, stages = candidates[i]
        try:
            launched = launch_direct(kernel, (*grid(bm, bn), 1, 1)[:3], key, args, {**constexprs, "BM": bm, "BN": bn},
                                     aligned=aligned, num_warps=warps, num_stages=stages)
        except OutOfResources:
            if i + 1 == len(candidates):
                raise
            i += 1
            continue
        _CHOSEN[key] = i
        return launched


class Relaunch:
    """A launch made again for a later call (see `relaunches`): the compiled kernel, the grid and the arguments that
    are not tensors kept; each tensor argument taken from the later call's tensors, by its place among them."""

    def __init__(self, launched: Launched, places: dict):
        self._direct, self._grid = launched.direct, launched.grid
        self._args = [None if isinstance(a, torch.Tensor) else a for a in launched.args]  # no tensor kept alive
        self._takes = [(at, places[id(a)]) for at, a in enumerate(launched.args) if isinstance(a, torch.Tensor)]

    def __call__(self, stream, tensors):
        """Launch on `stream` (`launch_stream()`) with `tensors`, a later call's, in the first call's order."""
        args = self._args.copy()
        for at, i in self._takes:
            args[at] = tensors[i]
        self._direct.on(stream, self._grid, args)


def relaunches(launched, tensors) -> list[Relaunch] | None:
    """A call's launches (`launch_direct`'s results), to be made again by a later call whose tensors differ from
    this call's `tensors` in their addresses only, straight through the C launcher: no argument is derived again.
    The caller then reads the stream once for all of them (`launch_stream`) and asks `launch_hooked()` first.
    None where a launch cannot be made again that way: it went through Triton's dispatcher, its kernel is
    instrumented, or it read a tensor that is not among `tensors`."""
    if not all(one is not None and not one.direct.instrumented for one in launched):
        return None
    places = {id(t): i for i, t in reversed(list(enumerate(tensors))) if t is not None}  # the first place of each
    if not all(id(a) in places for one in launched for a in one.args if isinstance(a, torch.Tensor)):
        return None
    return [Relaunch(one, places) for one in launched]


__all__ = ["TESTED_TRITON", "triton_tested", "fast_paths_on", "LOG2E", "LN2", "on_machine", "autotune_configs", "cdiv",
           "next_power_of_2", "pow2_at_least_16", "sm_count", "capability", "is_hopper", "tma_ready", "tma_scratch",
           "current_stream", "launch_stream", "reused", "launch_hooked", "DirectLaunch", "Launched", "launch_direct",
           "aligned16", "launch", "Relaunch", "relaunches"]
