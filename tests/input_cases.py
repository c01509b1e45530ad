"""Classes of bad input that every public function must refuse with a clear error, before any launch.

A family's tests give a good call (a dict of arguments) and the names of its tensor arguments;
`bad_input_cases` makes one case per class and tensor, each with the exception it must raise and
words its message must contain (the argument's name among them).

    >>> @pytest.mark.parametrize("case", bad_input_cases(good, ["q", "k", "v"]), ids=case_id)
    >>> def test_refuses(case): expect_refusal(fn, case)
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

from attention_kernels.common import INTERPRET


@dataclasses.dataclass
class Case:
    id: str
    mutate: Callable[[dict], None]   # changes the good arguments in place
    exc: type
    match: str                       # a regular expression the message must match


def _set(name, make):
    def mutate(args):
        args[name] = make(args[name])
    return mutate


def bad_input_cases(tensors, *, kernel: bool = True, float_tensors=None) -> list[Case]:
    """One case per class of bad input and tensor argument.

    tensors: names of the tensor arguments. float_tensors: those that must be floating point (all by
    default). kernel: the function launches a Triton kernel, so the machine rule applies too (under
    the interpreter: CPU tensors and no bf16; on a GPU: CUDA tensors).
    """
    float_tensors = list(tensors if float_tensors is None else float_tensors)
    cases = []
    for name in tensors:
        cases += [
            Case(f"{name}-not-a-tensor", _set(name, lambda t: t.tolist()), TypeError, f"{name} must be a torch.Tensor"),
            Case(f"{name}-rank", _set(name, lambda t: t[0] if t.dim() > 1 else t[None, None]), ValueError,
                 f"{name} must have"),
            Case(f"{name}-meta-device", _set(name, lambda t: t.to("meta")), ValueError, f"{name}.*(device|meta)"),
        ]
    for name in float_tensors:
        cases.append(Case(f"{name}-int-dtype", _set(name, lambda t: t.to(torch.int32)), TypeError,
                          f"{name} has dtype int32"))
        if kernel:
            cases.append(Case(f"{name}-float64", _set(name, lambda t: t.double()), TypeError, f"{name}.*float64"))
    if kernel and INTERPRET:
        cases.append(Case("bf16-under-the-interpreter",
                          lambda args: args.update({n: args[n].bfloat16() for n in float_tensors}),
                          TypeError, "bfloat16"))
    return cases


def case_id(case: Case) -> str:
    return case.id


def expect_refusal(fn, good_args: Callable[[], dict], case: Case) -> None:
    """fn(**args) with the case's change raises its exception with its words, and changes no input."""
    args = good_args()
    case.mutate(args)
    before = {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor) and v.device.type != "meta"}
    with pytest.raises(case.exc, match=case.match):
        fn(**args)
    for k, v in before.items():
        assert torch.equal(args[k].nan_to_num(), v.nan_to_num()), f"{k} was changed in place"
