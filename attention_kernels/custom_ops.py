"""The public entry points as PyTorch custom operators, so that `torch.compile(fullgraph=True)` and
CUDA graphs take them whole.

`compiled_as_op` registers a function with `torch.library.custom_op` and returns a wrapper with the
function's name, docstring and signature. A plain (eager) call runs the Python function directly: the
dispatcher would add several microseconds to every call, and a decode step is bound by host time. A
call that torch.compile is tracing goes to the registered op instead, which the graph keeps as one
node; its fake implementation gives the shapes and dtypes of the outputs without launching anything.
Capturing an eager call in a `torch.cuda.graph` needs nothing more: the checks run on the host and the
kernels are captured as they launch.

    >>> @compiled_as_op("attention_kernels::fused_recurrent_gla", fake=linear_attention_fake, tuple_size=2)
    ... def fused_recurrent_gla(q, k, v, gk, scale=None, initial_state=None, output_final_state=False): ...
    >>> o, _ = torch.compile(fused_recurrent_gla, fullgraph=True)(q, k, v, gk)

The op's schema comes from the function's signature: an argument without a default is a Tensor;
one whose default is None is an optional Tensor; a bool, int, float or str default gives that type;
a scale (`FLOAT_ARGUMENTS`) is a float, optional where it has a default. Annotations, where present,
win (e.g. `num_splits: int | None = None`). Keyword-only arguments stay keyword-only. An op returns
`Tensor[]`, the tensors of the function's result in order (a None is left out), and the wrapper
rebuilds the function's result from it (`tuple_size`). An op that writes an argument in place returns
one `Tensor` instead: functionalization (how torch.compile handles mutation) takes no list from an
op that mutates.

Training. The compiled backward must be the eager one, so for every family that trains the ops sit
one level down (as in flash-attn): the family's `torch.autograd.Function` calls its forward and
backward launchers, and those are the registered ops
(`attention_fwd = compiled_as_op("attention_kernels::attention_fwd", fake=...)(attention_fwd)`). torch.compile
traces the Function itself, so its forward and backward are the eager code, each op one node, and
every kernel the backward launches is inside an op; the public function is left undecorated. (An op's
own autograd registration would not do: AOT autograd traces that backward outside Dynamo, where
`torch.compiler.is_compiling()` may be False, so a launcher it calls would run on fake tensors.)
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import torch

# The scales: a float (optional where there is a default; None means the function's default scale),
# where any other argument without a default is a tensor and any other `=None` an optional tensor.
FLOAT_ARGUMENTS = frozenset({"scale", "softmax_scale"})

_SCHEMA_TYPES = (torch.Tensor, Optional[torch.Tensor], bool, int, float, str, Optional[float], Optional[int],
                 Optional[bool])
_REQUIRED = inspect.Parameter.empty


def _op_type(fn: Callable, p: inspect.Parameter):
    """The Python type torch.library reads for parameter `p` of `fn` (see the module docstring)."""
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
        raise TypeError(f"{fn.__qualname__}: argument {p.name!r} is {p.kind.description}; an op's arguments "
                        "are named one by one")
    if p.annotation is not _REQUIRED and p.annotation in _SCHEMA_TYPES:
        return next(t for t in _SCHEMA_TYPES if t == p.annotation)   # `int | None` as Optional[int]
    if p.name in FLOAT_ARGUMENTS:
        return float if p.default is _REQUIRED else Optional[float]
    if p.default is _REQUIRED:
        return torch.Tensor
    if p.default is None:
        return Optional[torch.Tensor]
    if type(p.default) in (bool, int, float, str):
        return type(p.default)
    raise TypeError(f"{fn.__qualname__}: cannot derive a schema type for argument {p.name!r} "
                    f"(default {p.default!r}); annotate it with one of {_SCHEMA_TYPES}")


def _tensors(result) -> list[torch.Tensor]:
    """The tensors of a function's result, in order, without its Nones."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if t is not None]


def _rebuild(tensors, tuple_size: int | None):
    """The function's result from the op's tensors: tuple_size None gives one tensor bare and several as
    a tuple; an int gives a tuple of that many entries, the missing trailing ones None."""
    if tuple_size is None:
        return tensors[0] if len(tensors) == 1 else tuple(tensors)
    return tuple(tensors) + (None,) * (tuple_size - len(tensors))


def compiled_as_op(name: str, *, fake: Callable, mutates_args: tuple[str, ...] = (), tuple_size: int | None = None):
    """Register the decorated function as the custom op `name` ("namespace::op") for torch.compile.

    fake(**arguments): the outputs' shapes and dtypes, called with the op's arguments by name, returning
    what the function returns (tensors allocated with `new_empty`, None where the function gives None).
    mutates_args: the names of the tensor arguments the function writes in place (a decode step's
    state). tuple_size: the function returns a tuple of this many entries, trailing ones possibly None
    (e.g. 2 for (o, final_state)); None (the default) for one tensor, or a tuple with no None.
    Returns a decorator; the decorated function keeps its name, docstring and signature, and its op is
    its `op` attribute.

        >>> @compiled_as_op("attention_kernels::vector_add", fake=like("x"))
        ... def vector_add(x, y, block=1024): ...
        >>> torch.compile(vector_add, fullgraph=True)(x, y)      # one attention_kernels::vector_add node
    """
    def register(fn: Callable):
        signature = inspect.signature(fn, eval_str=True)
        parameters = list(signature.parameters.values())
        names = [p.name for p in parameters]
        position = {n: i for i, n in enumerate(names)}
        defaults = [p.default for p in parameters]
        keyword_only = [p.name for p in parameters if p.kind == p.KEYWORD_ONLY]
        n_positional = len(names) - len(keyword_only)

        one_tensor = bool(mutates_args)   # see the module docstring
        if one_tensor and tuple_size is not None:
            raise TypeError(f"{fn.__qualname__}: an op that mutates {mutates_args} must return one tensor")

        def implementation(*args, **kwargs):
            result = fn(*args, **kwargs)
            if one_tensor and not isinstance(result, torch.Tensor):
                raise TypeError(f"{fn.__qualname__} mutates {mutates_args}, so its op must return one tensor, "
                                f"got {type(result).__name__}")
            return result if one_tensor else _tensors(result)

        implementation.__signature__ = signature.replace(
            parameters=[p.replace(annotation=_op_type(fn, p)) for p in parameters],
            return_annotation=torch.Tensor if one_tensor else list[torch.Tensor])
        op = torch.library.custom_op(name, implementation, mutates_args=mutates_args)
        _check_schema(op, fn, parameters)

        def fake_tensors(*args, **kwargs):   # the dispatcher leaves out trailing defaults
            arguments = dict(zip(names, defaults))
            arguments.update(zip(names, args), **kwargs)
            result = fake(**arguments)
            return result if one_tensor else _tensors(result)
        op.register_fake(fake_tensors)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            if not torch.compiler.is_compiling():
                return fn(*args, **kwargs)
            values = list(defaults)
            if len(args) > n_positional:
                raise TypeError(f"{fn.__name__}() takes {n_positional} positional arguments, got {len(args)}")
            for i, value in enumerate(args):
                values[i] = value
            for key, value in kwargs.items():
                if key not in position:
                    raise TypeError(f"{fn.__name__}() got an unexpected keyword argument {key!r}")
                values[position[key]] = value
            result = op(*values[:n_positional], **dict(zip(keyword_only, values[n_positional:])))
            return result if one_tensor else _rebuild(result, tuple_size)

        call.op = op
        return call
    return register


def _check_schema(op, fn: Callable, parameters: list[inspect.Parameter]) -> None:
    """The registered schema lists the function's arguments, in order, with its defaults (at import,
    so that a signature edited without its op fails there, not inside a compiled graph)."""
    arguments = op._opoverload._schema.arguments
    registered = [(a.name, a.default_value if a.has_default_value() else _REQUIRED, a.kwarg_only)
                  for a in arguments]
    expected = [(p.name, p.default, p.kind == p.KEYWORD_ONLY) for p in parameters]
    if registered != expected:
        raise TypeError(f"{fn.__qualname__}: the op's schema {op._opoverload._schema} does not match the "
                        f"function's arguments {expected}")


# Fake implementations: the shapes and dtypes each family's functions return. An output the function
# allocates after making its input contiguous is contiguous here too.

def like(name: str) -> Callable:
    """A fake for a function that returns one new tensor shaped like its argument `name`."""
    def fake(**arguments):
        t = arguments[name]
        return t.new_empty(t.shape)
    return fake


def linear_attention_fake(q, v, output_final_state, cu_seqlens=None, **_):
    """(o like v, fp32 final state [B, H, K, V] ([N, H, K, V] for N packed sequences) or None): every GLA,
    Lightning and KDA form."""
    B = q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    H, K, V = q.shape[2], q.shape[3], v.shape[3]
    state = v.new_empty((B, H, K, V), dtype=torch.float32) if output_final_state else None
    return v.new_empty(v.shape), state


def ssd_chunk_scan_fake(x, B, return_final_states, cu_seqlens=None, **_):
    """Mamba-2's scan launch: (y like x, with return_final_states the fp32 final states [batch, nheads,
    headdim, dstate] ([N, ...] for N packed sequences, cu_seqlens [N + 1]), else None)."""
    y = x.new_empty(x.shape)
    if not return_final_states:
        return y, None
    states = x.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return y, x.new_empty((states, x.shape[2], x.shape[3], B.shape[-1]), dtype=torch.float32)


def gradients_like(*names: str) -> Callable:
    """A fake for a backward launcher that returns one gradient shaped like each named argument, in
    order (None where that argument is None)."""
    def fake(**arguments):
        return tuple(None if arguments[n] is None else arguments[n].new_empty(arguments[n].shape) for n in names)
    return fake


def mla_decode_fake(q, head_dim_v, **_):
    """MLA decode: (out [B, s_q, H, head_dim_v] in q's dtype, fp32 lse [B, H, s_q])."""
    B, S_Q, H = q.shape[:3]
    return q.new_empty((B, S_Q, H, head_dim_v)), q.new_empty((B, H, S_Q), dtype=torch.float32)


def attention_fwd_fake(q, **_):
    """FlashAttention's forward launch: (o like q, in q's dtype; the fp32 log-sum-exp, [B, Hq, T] for a
    dense q [B, T, Hq, D], [Hq, total] for packed sequences, q [total, Hq, D])."""
    *batch, T, HQ, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((*batch, HQ, T), dtype=torch.float32)


def attention_bwd_fake(q, k, v, **_):
    """FlashAttention's backward launch: (dq, dk, dv), each allocated like its (contiguous) input."""
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


__all__ = ["compiled_as_op", "FLOAT_ARGUMENTS", "like", "linear_attention_fake", "ssd_chunk_scan_fake",
           "gradients_like", "mla_decode_fake", "attention_fwd_fake", "attention_bwd_fake"]
