"""torch.compile and CUDA graphs through the custom operators (attention_kernels/custom_ops.py).

On the CPU (the interpreter): for every registered op, `torch.compile(fullgraph=True,
backend="aot_eager")` gives exactly the eager result (fp32 and fp16, defaults and every optional
argument, a state written in place, FlashAttention's gradients), the compiled graph holds the op,
`torch.library.opcheck` passes, and an eager call never enters the dispatcher. On a GPU: Inductor,
mode="reduce-overhead" and `torch.cuda.graph` capture and replay give exactly the eager result.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch.utils._python_dispatch import TorchDispatchMode

from attention_kernels.common import DEVICE
from attention_kernels.custom_ops import compiled_as_op, like
from attention_kernels.flash_attn import flash_attn_func, flash_attn_varlen_func
from attention_kernels.flash_attn import interface as flash_interface
from attention_kernels.gla import interface as gla_interface
from attention_kernels.kda import interface as kda_interface
from attention_kernels.lightning import interface as lightning_interface
from attention_kernels.mamba2 import interface as mamba2_interface
from attention_kernels.gla import chunk_gla, fused_recurrent_gla, sequential_chunk_gla
from attention_kernels.kda import chunk_kda, fused_recurrent_kda
from attention_kernels.lightning import chunk_lightning, fused_recurrent_lightning, lightning_slopes
from attention_kernels.mamba2 import selective_state_update, ssd_chunk_scan
from attention_kernels.primer import attention_tile, softmax_rows, vector_add


@dataclasses.dataclass
class OpCase:
    """A registered function and its arguments: make(device, dtype, options) -> (args, kwargs), with
    options=False for the defaults and True for every optional argument given."""
    id: str
    fn: Callable
    make: Callable
    mutated: tuple[str, ...] = ()   # arguments written in place (compared after the call)
    gpu_dtype: torch.dtype = torch.bfloat16
    # A form that trains registers its forward launcher, as FlashAttention does (its autograd Function is
    # traced): the launcher, and its arguments from the public call's (args, kwargs).
    launcher: Callable | None = None
    launcher_args: Callable | None = None

    @property
    def op(self):
        return (self.launcher or self.fn).op

    @property
    def node(self) -> str:
        """The op's node in a compiled graph."""
        return str(self.op._opoverload)

    def op_args(self, args, kwargs):
        return self.launcher_args(args, kwargs) if self.launcher else (args, kwargs)


def _randn(device, dtype, *shape):
    return torch.randn(*shape, device=device).to(dtype)


def _primer_add(device, dtype, options):
    x, y = _randn(device, dtype, 2, 37).unbind(0)
    return (x, y), ({"block": 16} if options else {})


def _primer_softmax(device, dtype, options):
    return (_randn(device, dtype, 3, 10),), {}


def _primer_tile(device, dtype, options):
    q, k, v = _randn(device, dtype, 1, 5, 2, 16), _randn(device, dtype, 1, 7, 2, 16), _randn(device, dtype, 1, 7, 2, 16)
    return (q, k, v), ({"softmax_scale": 0.3} if options else {})


def _linear(gate):
    """Arguments of a linear-attention form: q, k [1, 20, 2, 16], v [1, 20, 2, 24], then its gates."""
    def make(device, dtype, options):
        B, T, H, K, V = 1, 20, 2, 16, 24
        q, k = _randn(device, dtype, B, T, H, K), _randn(device, dtype, B, T, H, K)
        v = _randn(device, dtype, B, T, H, V)
        gates = {"gk": lambda: (F.logsigmoid(_randn(device, torch.float32, B, T, H, K)) / 4,),
                 "slopes": lambda: (torch.rand(H, device=device),),
                 "kda": lambda: (F.logsigmoid(_randn(device, torch.float32, B, T, H, K)) / 4,
                                 torch.rand(B, T, H, device=device))}[gate]()
        kwargs = {}
        if options:
            kwargs = {"scale": 0.4, "initial_state": torch.randn(B, H, K, V, device=device),
                      "output_final_state": True}
            if gate == "kda":
                kwargs["use_qk_l2norm_in_kernel"] = True
        return (q, k, v, *gates), kwargs
    return make


def _mamba2_step(device, dtype, options):
    b, H, P, N, slots = 2, 2, 16, 16, 3
    A = (-torch.rand(H, device=device) - 0.1)[:, None, None].expand(H, P, N)   # one scalar per head
    args = (torch.randn(slots if options else b, H, P, N, device=device), _randn(device, dtype, b, H, P),
            torch.randn(b, H, P, device=device) * 0.5 - 1, A, _randn(device, dtype, b, 1, N),
            _randn(device, dtype, b, 1, N))
    kwargs = {}
    if options:
        kwargs = {"D": torch.randn(H, P, device=device), "z": _randn(device, dtype, b, H, P),
                  "dt_bias": torch.randn(H, P, device=device) * 0.5, "dt_softplus": True,
                  "state_batch_indices": torch.tensor([2, 0], device=device)}
    return args, kwargs


def _mamba2_scan(device, dtype, options):
    Bt, T, H, P, N = 1, 20, 2, 16, 16
    args = (_randn(device, dtype, Bt, T, H, P), torch.randn(Bt, T, H, device=device) * 0.5 - 1,
            -torch.rand(H, device=device) - 0.1, _randn(device, dtype, Bt, T, 1, N), _randn(device, dtype, Bt, T, 1, N))
    kwargs = {}
    if options:
        kwargs = {"chunk_size": 64, "D": torch.randn(H, P, device=device), "z": _randn(device, dtype, Bt, T, H, P),
                  "dt_bias": torch.randn(H, device=device) * 0.5, "dt_softplus": True,
                  "initial_states": torch.randn(Bt, H, P, N, device=device), "return_final_states": True}
    return args, kwargs


def _chunk_launch_args(gamma_from_slopes):
    """chunk_gla's or chunk_lightning's arguments as their forward launcher takes them (checked: the
    default scale filled in; Lightning's slopes as the log decay -slopes)."""
    def launcher_args(args, kwargs):
        q, k, v, gate = args
        default = q.shape[-1] ** -0.5 if not gamma_from_slopes else 1.0
        return (q, k, v, -gate if gamma_from_slopes else gate, kwargs.get("scale", default),
                kwargs.get("initial_state"), kwargs.get("output_final_state", False), kwargs.get("cu_seqlens")), {}
    return launcher_args


def _kda_launch_args(args, kwargs):
    """chunk_kda's arguments as its forward launcher takes them (the default scale filled in)."""
    q, k, v, g, beta = args
    return (q, k, v, g, beta, kwargs.get("scale", q.shape[-1] ** -0.5), kwargs.get("initial_state"),
            kwargs.get("output_final_state", False), kwargs.get("use_qk_l2norm_in_kernel", False),
            kwargs.get("cu_seqlens")), {}


def _mamba2_scan_launch_args(args, kwargs):
    """ssd_chunk_scan's arguments as its forward launcher takes them (in order, the defaults filled in)."""
    bound = inspect.signature(ssd_chunk_scan).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.args, {}


CASES = [
    OpCase("vector_add", vector_add, _primer_add),
    OpCase("softmax_rows", softmax_rows, _primer_softmax),
    OpCase("attention_tile", attention_tile, _primer_tile),
    OpCase("fused_recurrent_gla", fused_recurrent_gla, _linear("gk")),
    OpCase("sequential_chunk_gla", sequential_chunk_gla, _linear("gk")),
    OpCase("chunk_gla", chunk_gla, _linear("gk"), launcher=gla_interface._chunk_gla_fwd,
           launcher_args=_chunk_launch_args(False)),
    OpCase("fused_recurrent_lightning", fused_recurrent_lightning, _linear("slopes")),
    OpCase("chunk_lightning", chunk_lightning, _linear("slopes"), launcher=lightning_interface._chunk_lightning_fwd,
           launcher_args=_chunk_launch_args(True)),
    OpCase("fused_recurrent_kda", fused_recurrent_kda, _linear("kda")),
    OpCase("chunk_kda", chunk_kda, _linear("kda"), launcher=kda_interface._chunk_kda_fwd,
           launcher_args=_kda_launch_args),
    OpCase("selective_state_update", selective_state_update, _mamba2_step, mutated=("state",)),
    OpCase("ssd_chunk_scan", ssd_chunk_scan, _mamba2_scan, launcher=mamba2_interface._ssd_chunk_scan_fwd,
           launcher_args=_mamba2_scan_launch_args),
]
CPU_VARIANTS = [(torch.float32, False), (torch.float32, True), (torch.float16, True)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles from scratch (the decorated functions share one wrapper's code, and Dynamo
    caches per code object: without a reset, later tests would hit its recompile limit)."""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


def _clone(args, kwargs):
    """Fresh copies of the tensor arguments; a broadcast one (a stride 0, never written) is passed as it
    is, since a clone would lose its strides (Mamba-2's A takes a fast path on them)."""
    same = lambda x: x.clone() if isinstance(x, torch.Tensor) and 0 not in x.stride() else x   # noqa: E731
    return tuple(map(same, args)), {k: same(x) for k, x in kwargs.items()}


def _recording_backend():
    """aot_eager that also records every call node of the forward and backward graphs (as text).

    AOT autograd runs with `torch.compiler.is_compiling()` False, as under torch 2.11 (newer releases hold
    it True for the whole compile): Python code that AOT autograd traces and Dynamo did not (an op's
    registered backward) then calls the launchers directly, and a Triton kernel launched on fake tensors
    fails here as it does under Inductor on a GPU."""
    nodes = []

    def record(gm, example_inputs):
        nodes.extend(n.format_node() for n in gm.graph.nodes if n.op == "call_function")
        return make_boxed_func(gm.forward)
    aot_eager = aot_autograd(fw_compiler=record, bw_compiler=record)

    def backend(gm, example_inputs):
        compiling = torch.compiler._is_compiling_flag
        torch.compiler._is_compiling_flag = False
        try:
            return aot_eager(gm, example_inputs)
        finally:
            torch.compiler._is_compiling_flag = compiling
    return backend, nodes


def _assert_same(compiled, eager, what="output"):
    """Exactly equal results of one structure (tensors or None), with no NaN."""
    if isinstance(eager, (tuple, list)):
        assert isinstance(compiled, type(eager)) and len(compiled) == len(eager), f"{what}: {compiled!r}"
        for i, (c, e) in enumerate(zip(compiled, eager)):
            _assert_same(c, e, f"{what}[{i}]")
        return
    if eager is None:
        assert compiled is None, f"{what}: compiled gave a tensor where eager gives None"
        return
    assert compiled.shape == eager.shape and compiled.dtype == eager.dtype and compiled.stride() == eager.stride(), what
    assert not eager.isnan().any(), f"{what}: NaN"
    assert torch.equal(compiled, eager), f"{what}: compiled differs from eager"


def _check_against_eager(case, run, args, kwargs):
    """run(fn) on fresh copies of the arguments equals the eager call, mutated arguments included."""
    args_c, kwargs_c = _clone(args, kwargs)
    args_e, kwargs_e = _clone(args, kwargs)
    compiled = run(args_c, kwargs_c)
    eager = case.fn(*args_e, **kwargs_e)
    _assert_same(compiled, eager)
    names = list(case.op._opoverload._schema.arguments)
    for name in case.mutated:
        i = [a.name for a in names].index(name)
        before, c, e = args[i], args_c[i], args_e[i]
        assert not torch.equal(e, before), f"{name} was not written"
        _assert_same(c, e, name)


@pytest.mark.parametrize("dtype,options", CPU_VARIANTS, ids=["fp32-defaults", "fp32-every-option", "fp16-every-option"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_compiled_equals_eager(case, dtype, options):
    args, kwargs = case.make(DEVICE, dtype, options)
    backend, nodes = _recording_backend()
    compiled = torch.compile(case.fn, fullgraph=True, backend=backend)
    _check_against_eager(case, lambda a, kw: compiled(*a, **kw), args, kwargs)
    assert sum(case.node in n for n in nodes) == 1, nodes
    # the compiled run returns the real outputs: the fake's shapes, dtypes and strides are checked apart
    torch.library.opcheck(case.op, *_clone(*case.op_args(args, kwargs)), test_utils="test_faketensor")


def test_arguments_by_position_and_keyword():
    """The compiled wrapper binds arguments as Python does: positionally, by keyword, defaults filled."""
    (q, k, v, gk), kwargs = _linear("gk")(DEVICE, torch.float32, True)
    compiled = torch.compile(fused_recurrent_gla, fullgraph=True, backend="aot_eager")
    positional = compiled(q, k, v, gk, None, kwargs["scale"], kwargs["initial_state"], True)   # fla's: gv fifth
    keywords = compiled(q=q, k=k, v=v, gk=gk, output_final_state=True, initial_state=kwargs["initial_state"],
                        scale=kwargs["scale"])
    _assert_same(positional, fused_recurrent_gla(q, k, v, gk, **kwargs))
    _assert_same(keywords, positional)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_opcheck(case):
    """Schema (mutation declared), fake tensors (shapes, dtypes, strides), and AOT dispatch with dynamic
    shapes. test_autograd_registration has nothing to check: these forms take no gradients."""
    args, kwargs = _clone(*case.op_args(*case.make(DEVICE, torch.float32, True)))
    torch.library.opcheck(case.op, args, kwargs)


# FlashAttention: the ops are its forward and backward launchers, under FlashAttnFunction.

FLASH_SHAPES = [  # (B, T, S, Hq, Hkv, D, causal, softmax_scale)
    (1, 5, 7, 2, 1, 32, True, None),
    (2, 9, 6, 2, 2, 32, False, 0.2),
]


def _flash_inputs(B, T, S, HQ, HKV, D, dtype, device=DEVICE):
    return (_randn(device, dtype, B, T, HQ, D).requires_grad_(), _randn(device, dtype, B, S, HKV, D).requires_grad_(),
            _randn(device, dtype, B, S, HKV, D).requires_grad_())


def _flash_run(fn, q, k, v, causal, scale, g):
    """o and the gradients of q, k, v for the incoming gradient g."""
    for t in (q, k, v):
        t.grad = None
    o = fn(q, k, v, causal=causal, softmax_scale=scale)
    o.backward(g)
    return o.detach(), q.grad.clone(), k.grad.clone(), v.grad.clone()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape", FLASH_SHAPES, ids=lambda s: "B{}-T{}-S{}-Hq{}-Hkv{}-D{}-causal{}-scale{}".format(*s))
def test_flash_attn_compiled_forward_and_backward_equal_eager(shape, dtype):
    B, T, S, HQ, HKV, D, causal, scale = shape
    q, k, v = _flash_inputs(B, T, S, HQ, HKV, D, dtype)
    g = torch.randn_like(q)
    backend, nodes = _recording_backend()
    compiled = torch.compile(flash_attn_func, fullgraph=True, backend=backend)
    _assert_same(_flash_run(compiled, q, k, v, causal, scale, g),
                 _flash_run(flash_attn_func, q, k, v, causal, scale, g))
    assert sum("attention_kernels.attention_fwd.default" in n for n in nodes) == 1, nodes
    assert sum("attention_kernels.attention_bwd.default" in n for n in nodes) == 1, nodes
    with torch.no_grad():   # the inference path: the forward op alone
        _assert_same(compiled(q, k, v, causal=causal, softmax_scale=scale),
                     flash_attn_func(q, k, v, causal=causal, softmax_scale=scale))


def test_flash_attn_opcheck():
    q, k, v = (t.detach() for t in _flash_inputs(1, 5, 7, 2, 1, 32, torch.float32))
    o, lse = flash_interface.attention_fwd(q, k, v, True, 0.3)
    torch.library.opcheck(flash_interface.attention_fwd.op, (q, k, v, True, 0.3))
    for one_launch in (True, False):
        torch.library.opcheck(flash_interface.attention_bwd.op, (torch.randn_like(o), q, k, v, o, lse, True, 0.3,
                                                                 one_launch))


# The decorator itself

class RecordOps(TorchDispatchMode):
    """Every operator that reaches the dispatcher's Python key, by name."""
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ("vector_add", "fused_recurrent_gla",
                                                               "selective_state_update")], ids=lambda c: c.id)
def test_eager_call_skips_the_dispatcher(case):
    """A plain call runs the Python function: the op never reaches the dispatcher (the control call,
    through the op, shows that the recording would see it)."""
    args, kwargs = case.make(DEVICE, torch.float32, True)
    with RecordOps() as eager:
        case.fn(*_clone(args, kwargs)[0], **kwargs)
    assert not any(n.startswith("attention_kernels.") for n in eager.names), eager.names
    with RecordOps() as through_op:
        case.fn.op(*_clone(args, kwargs)[0], **kwargs)
    assert f"attention_kernels.{case.id}.default" in through_op.names


def test_schema_from_the_signature():
    """The schema every op registers (the report's table), so that a change to it is seen."""
    assert str(fused_recurrent_gla.op._opoverload._schema) == (
        "attention_kernels::fused_recurrent_gla(Tensor q, Tensor k, Tensor v, Tensor gk, float? scale=None, "
        "Tensor? initial_state=None, bool output_final_state=False, Tensor? cu_seqlens=None, "
        "Tensor? ssm_state_indices=None) -> Tensor[]")
    assert str(gla_interface._fused_recurrent_gla_inplace.op._opoverload._schema) == (
        "attention_kernels::fused_recurrent_gla_inplace(Tensor q, Tensor k, Tensor v, Tensor gk, Tensor(a4!) initial_state, "
        "float? scale=None, Tensor? ssm_state_indices=None) -> Tensor")
    assert str(fused_recurrent_lightning.op._opoverload._schema).startswith(
        "attention_kernels::fused_recurrent_lightning(Tensor q, Tensor k, Tensor v, Tensor slopes, float? scale=1., ")
    assert str(gla_interface._chunk_gla_bwd.op._opoverload._schema) == (
        "attention_kernels::chunk_gla_bwd(Tensor q, Tensor k, Tensor v, Tensor gk, float scale, Tensor? h0, Tensor do, "
        "Tensor? dht, Tensor? cu_seqlens=None, Tensor? A=None) -> Tensor[]")
    assert str(gla_interface._chunk_gla_fwd_keeping_scores.op._opoverload._schema) == (
        "attention_kernels::chunk_gla_fwd_keeping_scores(Tensor q, Tensor k, Tensor v, Tensor gk, float scale, "
        "Tensor? h0, bool output_final_state, Tensor? cu_seqlens=None) -> Tensor[]")
    assert str(mamba2_interface._ssd_chunk_scan_fwd_keeping_ungated.op._opoverload._schema) == (
        "attention_kernels::ssd_chunk_scan_fwd_keeping_ungated(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "SymInt chunk_size, Tensor? D, Tensor z, Tensor? dt_bias, bool dt_softplus, Tensor? initial_states, "
        "bool return_final_states, Tensor? cu_seqlens) -> Tensor[]")
    assert str(mamba2_interface._ssd_chunk_scan_bwd.op._opoverload._schema) == (
        "attention_kernels::ssd_chunk_scan_bwd(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D, "
        "Tensor? z, Tensor? dt_bias, bool dt_softplus, Tensor? initial_states, Tensor dy, Tensor? dfinal, "
        "Tensor? cu_seqlens, Tensor? y_ungated=None) -> Tensor[]")
    assert str(selective_state_update.op._opoverload._schema) == (
        "attention_kernels::selective_state_update(Tensor(a0!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, "
        "Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, "
        "Tensor? state_batch_indices=None) -> Tensor")
    assert str(vector_add.op._opoverload._schema) == (
        "attention_kernels::vector_add(Tensor x, Tensor y, SymInt block=1024) -> Tensor[]")
    assert str(flash_interface.attention_fwd.op._opoverload._schema) == (
        "attention_kernels::attention_fwd(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, str backend=\"auto\") -> Tensor[]")


def _variadic(x, *rest):
    return x


def _tuple_default(x, dims=(0, 1)):
    return x


def _mutating_pair(state, x):
    return x, x


@pytest.mark.parametrize("fn,kwargs,match", [
    (_variadic, {}, "argument .rest. is variadic positional; an op.s arguments are named"),
    (_tuple_default, {}, "cannot derive a schema type for argument .dims."),
    (_mutating_pair, {"mutates_args": ("state",), "tuple_size": 2}, "must return one tensor"),
], ids=["variadic", "tuple-default", "mutating-tuple"])
def test_refuses_what_a_schema_cannot_say(fn, kwargs, match):
    with pytest.raises(TypeError, match=match):
        compiled_as_op(f"kernels_test::{fn.__name__.strip('_')}", fake=like("x"), **kwargs)(fn)


# On a GPU: Inductor, CUDA graphs through torch.compile, and a captured eager call.

def _gpu_case(case):
    return case.make("cuda", case.gpu_dtype, True)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_inductor_equals_eager(case):
    compiled = torch.compile(case.fn, fullgraph=True)
    _check_against_eager(case, lambda a, kw: compiled(*a, **kw), *_gpu_case(case))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reduce_overhead_equals_eager(case):
    """Several calls, so that the CUDA graph is recorded and then replayed (outputs cloned: a replay
    overwrites them)."""
    compiled = torch.compile(case.fn, fullgraph=True, mode="reduce-overhead")

    def run(a, kw):
        for _ in range(2):   # on copies, so that the arguments reach the last call unwritten
            a_i, kw_i = _clone(a, kw)
            compiled(*a_i, **kw_i)
        out = compiled(*a, **kw)
        return tuple(None if t is None else t.clone() for t in out) if isinstance(out, tuple) else out.clone()
    _check_against_eager(case, run, *_gpu_case(case))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cuda_graph_capture_and_replay_equal_eager(case):
    """An eager call captured in a torch.cuda.graph, replayed on new inputs copied into its static ones."""
    static_args, static_kwargs = _gpu_case(case)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):   # first calls compile the kernels: outside the capture
        for _ in range(2):
            args_i, kwargs_i = _clone(static_args, static_kwargs)
            case.fn(*args_i, **kwargs_i)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = case.fn(*static_args, **static_kwargs)
    new_args, new_kwargs = case.make("cuda", case.gpu_dtype, True)
    # a broadcast (stride-0) input cannot be copied into: the replay keeps the captured one
    keep = lambda s, n: s if isinstance(s, torch.Tensor) and 0 in s.stride() else n   # noqa: E731
    new_args = tuple(map(keep, static_args, new_args))
    new_kwargs = {k: keep(static_kwargs[k], n) for k, n in new_kwargs.items()}

    def replay(a, kw):
        for s, n in zip(static_args + tuple(static_kwargs.values()), a + tuple(kw.values())):
            if isinstance(s, torch.Tensor) and 0 not in s.stride():
                s.copy_(n)
        graph.replay()
        for s, n in zip(static_args, a):   # hand back what the replay wrote (the mutated state)
            if isinstance(s, torch.Tensor) and 0 not in s.stride():
                n.copy_(s)
        return static_out
    _check_against_eager(case, replay, new_args, new_kwargs)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", [None, "reduce-overhead"], ids=["inductor", "reduce-overhead"])
def test_flash_attn_gpu_compiled_equals_eager(mode):
    q, k, v = _flash_inputs(2, 300, 400, 8, 2, 64, torch.bfloat16, device="cuda")
    g = torch.randn_like(q)
    compiled = torch.compile(flash_attn_func, fullgraph=True, mode=mode)
    for _ in range(3):   # reduce-overhead records, then replays
        got = _flash_run(compiled, q, k, v, True, None, g)
    _assert_same(got, _flash_run(flash_attn_func, q, k, v, True, None, g))


@pytest.mark.gpu
def test_flash_attn_cuda_graph_capture_and_replay():
    q, k, v = (t.detach() for t in _flash_inputs(2, 300, 400, 8, 2, 64, torch.bfloat16, device="cuda"))
    flash_attn_func(q, k, v, causal=True)   # compile the kernel outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_o = flash_attn_func(q, k, v, causal=True)
    for t in (q, k, v):
        t.copy_(torch.randn_like(t))
    graph.replay()
    _assert_same(static_o, flash_attn_func(q, k, v, causal=True))


def test_mla_decode_compiles_whole():
    """MLA's decode as one op: `block_table` and `num_splits` annotated (their None is a tensor's and an
    int's), keyword-only arguments kept, a dense and a split call equal eager's."""
    from attention_kernels.mla import mla_decode

    assert str(mla_decode.op._opoverload._schema) == (
        "attention_kernels::mla_decode(Tensor q, Tensor kv_cache, Tensor? block_table, Tensor cache_seqlens, "
        "SymInt head_dim_v=512, float? softmax_scale=None, bool causal=False, *, SymInt? num_splits=None, "
        "bool check_seqlens=True, str backend=\"auto\") -> Tensor[]")
    q, kv = torch.randn(2, 2, 3, 72, device=DEVICE), torch.randn(2, 37, 72, device=DEVICE)
    lens = torch.tensor([5, 37], dtype=torch.int32, device=DEVICE)
    compiled = torch.compile(mla_decode, fullgraph=True, backend="aot_eager")
    for kwargs in ({}, {"num_splits": 2, "check_seqlens": False, "backend": "triton"}):
        _assert_same(compiled(q, kv, None, lens, 64, 0.1, True, **kwargs),
                     mla_decode(q, kv, None, lens, 64, 0.1, True, **kwargs))
    torch.library.opcheck(mla_decode.op, (q, kv, None, lens, 64, 0.1), {"num_splits": 2})


# ------------------------------------------------------------------ the linear forms that train
def _linear_training_inputs(family, dtype, device=DEVICE):
    """q, k, v, the gate (GLA's gk) or the slopes (Lightning), an initial state; T = 70 crosses a chunk."""
    B, T, H, K, V = 1, 70, 2, 32, 16
    q, k = (torch.randn(B, T, H, K, device=device, dtype=dtype) for _ in range(2))
    v = torch.randn(B, T, H, V, device=device, dtype=dtype)
    gate = (torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, device=device)) / 8 if family == "gla"
            else lightning_slopes(H).to(device))
    h0 = torch.randn(B, H, K, V, device=device)
    return q, k, v, gate, h0


def _linear_training_run(fn, q, k, v, gate, h0, trained):
    """o, the final state and the gradients of the trained inputs, for a loss through both outputs."""
    inputs = [t.detach().clone().requires_grad_(name in trained)
              for name, t in zip(("q", "k", "v", "gate", "h0"), (q, k, v, gate, h0))]
    o, ht = fn(*inputs[:4], initial_state=inputs[4], output_final_state=True)
    torch.manual_seed(1)
    (o * torch.randn_like(o)).sum().add((ht * torch.randn_like(ht)).sum()).backward()
    return (o.detach(), ht.detach(),
            *(t.grad for name, t in zip(("q", "k", "v", "gate", "h0"), inputs) if name in trained))


@pytest.mark.parametrize("family", ["gla", "lightning"])
def test_linear_forms_train_compiled_as_eager(family):
    """chunk_gla and chunk_lightning under torch.compile(fullgraph=True): one op in the forward graph
    (GLA's the forward that keeps its scores for the backward), and every gradient (through o and the final
    state) equal to the eager call's, bit for bit."""
    fn = chunk_gla if family == "gla" else chunk_lightning
    trained = ("q", "k", "v", "gate", "h0") if family == "gla" else ("q", "k", "v", "h0")
    forward_op = "chunk_gla_fwd_keeping_scores" if family == "gla" else "chunk_lightning_fwd"
    inputs = _linear_training_inputs(family, torch.float32)
    backend, nodes = _recording_backend()
    compiled = torch.compile(fn, fullgraph=True, backend=backend)
    _assert_same(_linear_training_run(compiled, *inputs, trained), _linear_training_run(fn, *inputs, trained))
    assert sum(f"attention_kernels.{forward_op}.default" in n for n in nodes) == 1, nodes
    assert sum(f"attention_kernels.chunk_{family}_bwd.default" in n for n in nodes) == 1, nodes


def test_kda_trains_compiled_as_eager():
    """chunk_kda under torch.compile(fullgraph=True), with the L2 norm in the kernel: one forward op, one
    backward op, and every gradient (through o and the final state) equal to the eager call's, bit for bit."""
    q, k, v, g, h0 = _linear_training_inputs("gla", torch.float32)
    beta = torch.rand(*q.shape[:3], device=DEVICE)

    def run(fn):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta, h0)]
        o, ht = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, use_qk_l2norm_in_kernel=True)
        torch.manual_seed(1)
        (o * torch.randn_like(o)).sum().add((ht * torch.randn_like(ht)).sum()).backward()
        return (o.detach(), ht.detach(), *(t.grad for t in leaves))

    backend, nodes = _recording_backend()
    _assert_same(run(torch.compile(chunk_kda, fullgraph=True, backend=backend)), run(chunk_kda))
    assert sum("attention_kernels.chunk_kda_fwd_keeping_scores.default" in n for n in nodes) == 1, nodes
    assert sum("attention_kernels.chunk_kda_bwd.default" in n for n in nodes) == 1, nodes


@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
def test_kda_backward_opcheck(with_state):
    """chunk_kda's backward launcher as an op: its fake gives the real gradients' shapes, dtypes and
    strides (none for an absent initial state)."""
    q, k, v, g, h0 = _linear_training_inputs("gla", torch.float32)
    beta = torch.rand(*q.shape[:3], device=DEVICE)
    h0, dht = (h0, torch.randn_like(h0)) if with_state else (None, None)
    torch.library.opcheck(kda_interface._chunk_kda_bwd.op,
                          (q, k, v, g, beta, 0.25, h0, torch.randn_like(v), dht, with_state))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_kda_training_ops_opcheck(packed):
    """KDA's training forward (o, the scores and the solve's inverse, the final state) and its backward given those:
    each op's fake gives the real outputs' shapes, dtypes and strides, one sequence or two packed."""
    q, k, v, g, h0 = _linear_training_inputs("gla", torch.float32)
    beta = torch.rand(*q.shape[:3], device=DEVICE)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    h0 = torch.cat([h0] * 2) if packed else h0
    forward = kda_interface._chunk_kda_fwd_keeping_scores
    # Aqk's blocks above the diagonal are left unwritten (never read): no comparison of two runs' outputs
    torch.library.opcheck(forward.op, (q, k, v, g, beta, 0.2, h0, True, True, cu),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    _, Aqk, inverse, _ = forward(q, k, v, g, beta, 0.2, h0, True, True, cu)
    torch.library.opcheck(kda_interface._chunk_kda_bwd.op, (q, k, v, g, beta, 0.2, h0, torch.randn_like(v),
                                                           torch.randn_like(h0), True, cu, Aqk, inverse))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
def test_gla_training_ops_opcheck(packed, with_state):
    """GLA's training forward (o, the scores A, the final state or none) and its backward given those scores:
    each op's fake gives the real outputs' shapes, dtypes and strides, one sequence or two packed."""
    q, k, v, gate, h0 = _linear_training_inputs("gla", torch.float32)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    h0 = (torch.cat([h0] * 2) if packed else h0) if with_state else None
    forward = gla_interface._chunk_gla_fwd_keeping_scores
    # A's blocks above the diagonal are left unwritten (never read), so two runs' A differ there: the check
    # that compares a traced run's outputs with eager's is left out for the forward
    torch.library.opcheck(forward.op, (q, k, v, gate, 0.2, h0, with_state, cu),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    _, A, _ = forward(q, k, v, gate, 0.2, h0, with_state, cu)
    dht = torch.randn_like(h0) if with_state else None
    torch.library.opcheck(gla_interface._chunk_gla_bwd.op, (q, k, v, gate, 0.2, h0, torch.randn_like(v), dht, cu, A))


def _mamba2_training_run(fn, inputs, trained, cu_seqlens=None):
    """y, the final states and the gradients of the trained inputs, for a loss through both outputs."""
    leaves = {n: t.detach().clone().requires_grad_(n in trained) for n, t in inputs.items()}
    x, dt, A, B, C = (leaves[n] for n in ("x", "dt", "A", "B", "C"))
    y, h = fn(x, dt, A, B, C, chunk_size=32, D=leaves["D"], z=leaves["z"], dt_bias=leaves["dt_bias"],
              dt_softplus=True, initial_states=leaves["initial_states"], return_final_states=True,
              cu_seqlens=cu_seqlens)
    torch.manual_seed(1)
    (y * torch.randn_like(y)).sum().add((h * torch.randn_like(h)).sum()).backward()
    return (y.detach(), h.detach(), *(leaves[n].grad for n in trained))


def _mamba2_training_inputs(dtype, device=DEVICE):
    """Every input of the scan (D per head, G = 2 groups of 4 heads, T = 70 across chunks); x, B, C, z in dtype."""
    Bt, T, H, P, N, G = 1, 70, 4, 16, 16, 2
    return {"x": _randn(device, dtype, Bt, T, H, P), "dt": torch.randn(Bt, T, H, device=device) * 0.5 - 1,
            "A": -torch.rand(H, device=device) - 0.1, "B": _randn(device, dtype, Bt, T, G, N),
            "C": _randn(device, dtype, Bt, T, G, N), "D": torch.randn(H, device=device),
            "z": _randn(device, dtype, Bt, T, H, P), "dt_bias": torch.randn(H, device=device) * 0.3,
            "initial_states": torch.randn(Bt, H, P, N, device=device)}


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_mamba2_scan_trains_compiled_as_eager(packed):
    """ssd_chunk_scan under torch.compile(fullgraph=True), every input trained, one sequence or two packed
    (lengths 30 and 40, the offsets read only when the op runs): one forward op (with z, the one that keeps
    the ungated output for the backward), one backward op (the launchers: every kernel of the backward inside
    an op, none run on fake tensors), and gradients equal to eager's."""
    inputs = _mamba2_training_inputs(torch.float32)
    cu = None
    if packed:
        cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE)
        inputs["initial_states"] = torch.cat([inputs["initial_states"]] * 2)
    backend, nodes = _recording_backend()
    compiled = torch.compile(ssd_chunk_scan, fullgraph=True, backend=backend)
    _assert_same(_mamba2_training_run(compiled, inputs, tuple(inputs), cu),
                 _mamba2_training_run(ssd_chunk_scan, inputs, tuple(inputs), cu))
    assert sum("attention_kernels.ssd_chunk_scan_fwd_keeping_ungated.default" in n for n in nodes) == 1, nodes
    assert not any("attention_kernels.ssd_chunk_scan_fwd.default" in n for n in nodes), nodes
    assert sum("attention_kernels.ssd_chunk_scan_bwd.default" in n for n in nodes) == 1, nodes


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_mamba2_scan_backward_opcheck(packed):
    """The backward launcher's op: its fake gives the real gradients' shapes, dtypes and strides (one per
    given input, none for an absent one: here D and z are left out)."""
    inputs = _mamba2_training_inputs(torch.float32)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    states = 2 if packed else 1
    h0, dfinal = (torch.randn(states, *inputs["initial_states"].shape[1:], device=DEVICE) for _ in range(2))
    x, dt, A, B, C = (inputs[n] for n in ("x", "dt", "A", "B", "C"))
    torch.library.opcheck(torch.ops.attention_kernels.ssd_chunk_scan_bwd.default,
                          (x, dt, A, B, C, None, None, inputs["dt_bias"], True, h0, torch.randn_like(x), dfinal, cu))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_mamba2_training_ops_opcheck(packed):
    """The training forward with a gate (y, the ungated output, the final states) and the backward given that
    ungated output: each op's fake gives the real outputs' shapes, dtypes and strides, one sequence or two
    packed."""
    inputs = _mamba2_training_inputs(torch.float32)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=DEVICE) if packed else None
    states = 2 if packed else 1
    h0, dfinal = (torch.randn(states, *inputs["initial_states"].shape[1:], device=DEVICE) for _ in range(2))
    x, dt, A, B, C, D, z, dt_bias = (inputs[n] for n in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias"))
    forward = mamba2_interface._ssd_chunk_scan_fwd_keeping_ungated
    args = (x, dt, A, B, C, 32, D, z, dt_bias, True, h0, True, cu)
    torch.library.opcheck(forward.op, args)
    _, y_ungated, _ = forward(*args)
    torch.library.opcheck(torch.ops.attention_kernels.ssd_chunk_scan_bwd.default,
                          (x, dt, A, B, C, D, z, dt_bias, True, h0, torch.randn_like(x), dfinal, cu, y_ungated))


def test_mamba2_backward_op_refuses_a_wrong_ungated_output():
    """The backward op's y_ungated, reachable without the Function: one without z, or of another dtype or
    shape than x, is refused by name before any launch."""
    inputs = _mamba2_training_inputs(torch.float32)
    x, dt, A, B, C, z = (inputs[n] for n in ("x", "dt", "A", "B", "C", "z"))
    op = torch.ops.attention_kernels.ssd_chunk_scan_bwd.default
    for gate, kept, error in ((None, x.clone(), ValueError), (z, x.half(), TypeError), (z, x[:, :5], ValueError)):
        with pytest.raises(error, match="^y_ungated "):
            op(x, dt, A, B, C, None, gate, None, False, None, torch.randn_like(x), None, None, kept)


@pytest.mark.gpu
def test_mamba2_scan_trains_under_inductor():
    inputs = _mamba2_training_inputs(torch.bfloat16, device="cuda")
    _assert_same(_mamba2_training_run(torch.compile(ssd_chunk_scan, fullgraph=True), inputs, tuple(inputs)),
                 _mamba2_training_run(ssd_chunk_scan, inputs, tuple(inputs)))


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["gla", "lightning"])
def test_linear_forms_train_under_inductor(family):
    fn = chunk_gla if family == "gla" else chunk_lightning
    trained = ("q", "k", "v", "gate", "h0") if family == "gla" else ("q", "k", "v", "h0")
    inputs = _linear_training_inputs(family, torch.bfloat16, device="cuda")
    got = _linear_training_run(torch.compile(fn, fullgraph=True), *inputs, trained)
    _assert_same(got, _linear_training_run(fn, *inputs, trained))


def test_flash_attn_varlen_compiled_forward_and_backward_equal_eager():
    """Packed sequences (lengths 1, 70 and 33, GQA, causal) compile to the same two ops as a dense call,
    the offsets passed through as tensors, and give eager's output and gradients."""
    cu = torch.tensor([0, 1, 71, 104], dtype=torch.int32, device=DEVICE)
    q = torch.randn(104, 4, 32, device=DEVICE)
    k, v = (torch.randn(104, 2, 32, device=DEVICE) for _ in range(2))
    g = torch.randn_like(q)

    def run(fn):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = fn(*inputs, cu, cu, 70, 70, causal=True)
        o.backward(g)
        return o.detach(), *(t.grad for t in inputs)

    backend, nodes = _recording_backend()
    _assert_same(run(torch.compile(flash_attn_varlen_func, fullgraph=True, backend=backend)),
                 run(flash_attn_varlen_func))
    assert sum("attention_kernels.attention_fwd.default" in n for n in nodes) == 1, nodes
    assert sum("attention_kernels.attention_bwd.default" in n for n in nodes) == 1, nodes


def test_flash_attn_with_kvcache_compiles_whole():
    """The decode call with the new tokens appended in place compiles (fullgraph) to one attention_kernels::attention_decode
    node around the traced append, and gives eager's output, LSE and caches, in one slice and in three; the op
    passes opcheck."""
    from attention_kernels.flash_attn import flash_attn_with_kvcache

    q = torch.randn(2, 2, 4, 32, device=DEVICE)
    k_cache, v_cache = (torch.randn(2, 30, 2, 32, device=DEVICE) for _ in range(2))
    k, v = (torch.randn(2, 2, 2, 32, device=DEVICE) for _ in range(2))
    lens = torch.tensor([5, 20], dtype=torch.int32, device=DEVICE)

    def run(fn, num_splits):
        caches = k_cache.clone(), v_cache.clone()
        o, lse = fn(q, *caches, k, v, cache_seqlens=lens, causal=True, num_splits=num_splits,
                    return_softmax_lse=True)
        return o, lse, *caches

    for num_splits in (1, 3):
        backend, nodes = _recording_backend()
        _assert_same(run(torch.compile(flash_attn_with_kvcache, fullgraph=True, backend=backend), num_splits),
                     run(flash_attn_with_kvcache, num_splits))
        assert sum("attention_kernels.attention_decode.default" in n for n in nodes) == 1, nodes
    torch.library.opcheck(flash_interface.decode_fwd.op, (q, k_cache, v_cache, lens + 2, True, 0.3, 3))


# ------------------------------------------------------------------ the backward ops check what they are given
def _backward_op_calls():
    """(op, arguments with a wrong incoming gradient, the name the error must give) per backward launcher."""
    q, k, v, gate, h0 = _linear_training_inputs("gla", torch.float32)
    gla = (gla_interface._chunk_gla_bwd.op, (q, k, v, gate, 0.2, h0, torch.randn(1, 70, 2, 8), None), "do")
    slopes = lightning_slopes(2)
    lightning = (lightning_interface._chunk_lightning_bwd.op,
                 (q, k, v, -slopes, 1.0, h0, torch.randn_like(v), torch.randn(1, 2, 16, 32)), "dht")
    x, dt, A, B, C = (a.float() for a in _mamba2_scan(DEVICE, torch.float32, False)[0])
    mamba2 = (mamba2_interface._ssd_chunk_scan_bwd.op,
              (x, dt, A, B, C, None, None, None, False, None, torch.randn_like(x).half(), None, None), "dy")
    fq, fk, fv = (t.detach() for t in _flash_inputs(1, 5, 7, 2, 1, 32, torch.float32))
    o, lse = flash_interface.attention_fwd(fq, fk, fv, True, 0.2)
    flash = (flash_interface.attention_bwd.op, (fq[:, :4], fq, fk, fv, o, lse, True, 0.2, True), "do")
    beta = torch.rand(q.shape[:3])
    kda = (kda_interface._chunk_kda_bwd.op,   # do [1, 70, 2, 8] where o (v) is [1, 70, 2, 16]
           (q, k, v, gate, beta, 0.2, h0, torch.randn(1, 70, 2, 8), None, False, None, None, None), "do")
    return {"gla": gla, "lightning": lightning, "mamba2": mamba2, "flash_attn": flash, "kda": kda}


@pytest.mark.parametrize("family", ["gla", "lightning", "mamba2", "flash_attn", "kda"])
def test_backward_ops_refuse_a_wrong_gradient_by_name(family):
    """torch.ops.kernels.*_bwd are reachable without the autograd Function that calls them: an incoming
    gradient of the wrong shape or dtype is refused, naming it, before any launch."""
    op, args, name = _backward_op_calls()[family]
    with pytest.raises((ValueError, TypeError), match=rf"^{name} "):
        op(*args)


def _bad_input_op_calls():
    """(op, arguments with one bad tensor, the name the error must give): the forward launchers of the chunk forms
    (the training forwards that keep the scores or the ungated output among them) and FlashAttention's backward
    launcher, each with an input its public function would have refused (or, for the forward keeping Mamba-2's
    ungated output, without the z that output is kept for)."""
    q, k, v, gate, h0 = _linear_training_inputs("gla", torch.float32)
    beta = torch.rand(q.shape[:3])
    flash_q, flash_k, flash_v = (t.detach() for t in _flash_inputs(1, 5, 7, 2, 1, 32, torch.float32))
    o, lse = flash_interface.attention_fwd(flash_q, flash_k, flash_v, True, 0.2)

    def flash_bwd(**bad):
        given = {"do": torch.randn_like(o), "q": flash_q, "k": flash_k, "v": flash_v, "o": o, "lse": lse, **bad}
        return flash_interface.attention_bwd.op, (*given.values(), True, 0.2, True)

    scan_args, scan_kwargs = _mamba2_scan(DEVICE, torch.float32, True)
    z = scan_kwargs["z"]

    def ssd_keeping(**bad):
        args, _ = _mamba2_scan_launch_args(scan_args, {**scan_kwargs, **bad})
        return args

    return {
        "chunk_gla_fwd-gk": (gla_interface._chunk_gla_fwd.op, (q, k, v, gate[:, :60], 0.2, h0, True), "gk"),
        "chunk_lightning_fwd-initial_state": (lightning_interface._chunk_lightning_fwd.op,
                                              (q, k, v, -lightning_slopes(2), 1.0, h0[..., :8], True),
                                              "initial_state"),
        "chunk_kda_fwd-beta": (kda_interface._chunk_kda_fwd.op,
                               (q, k, v, gate, beta.to(torch.int32), 0.2, h0, True, False), "beta"),
        # the training forwards, which keep the scores (GLA, KDA) or the output before the gate (Mamba-2)
        "chunk_gla_fwd_keeping_scores-k": (gla_interface._chunk_gla_fwd_keeping_scores.op,
                                           (q, k[:, :60], v, gate, 0.2, h0, True), "k"),
        "chunk_kda_fwd_keeping_scores-g": (kda_interface._chunk_kda_fwd_keeping_scores.op,
                                           (q, k, v, gate[..., :16], beta, 0.2, h0, True, False), "g"),
        "ssd_chunk_scan_fwd_keeping_ungated-z": (mamba2_interface._ssd_chunk_scan_fwd_keeping_ungated.op,
                                                 ssd_keeping(z=z[:, :, :1]), "z"),
        "ssd_chunk_scan_fwd_keeping_ungated-no_z": (mamba2_interface._ssd_chunk_scan_fwd_keeping_ungated.op,
                                                    ssd_keeping(z=None), "z"),
        "attention_bwd-k": (*flash_bwd(k=flash_k[..., :16]), "k"),
        "attention_bwd-o": (*flash_bwd(o=o.half()), "o"),
        "attention_bwd-lse": (*flash_bwd(lse=lse[:, :, :4]), "lse"),
    }


@pytest.mark.parametrize("case", list(_bad_input_op_calls()))
def test_ops_refuse_a_bad_input_by_name(case):
    """The launchers that are ops (torch.ops.kernels.*) are reachable without the public function that checks
    their inputs: each checks them again, and refuses a bad one by its name before any launch."""
    op, args, name = _bad_input_op_calls()[case]
    with pytest.raises((ValueError, TypeError), match=rf"^{name} "):
        op(*args)
