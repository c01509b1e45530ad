"""What the linear families' tests share: argument mutations, the bad inputs every linear family
refuses alike, the check that a NaN or inf at one token reaches exactly the rows the math says, and a
kernel stand-in that records its launches' grids.

    >>> SHARED_CASES = linear_input_cases(token_tensors=("q", "k", "v", "gk"), key_tensors=("q", "k", "gk"))
    >>> assert_poison_pattern(o, S, o_ref, "v", token=35)
    >>> assert_inf_in_v(o, o_ref, token=4, exact=True)
"""
from __future__ import annotations

import math

import torch

from input_cases import Case
from attention_kernels.common import DEVICE, assert_close, tolerance


def replace(**changes):
    """A mutation: each named argument replaced by f(args)."""
    def mutate(args):
        args.update({k: f(args) for k, f in changes.items()})
    return mutate


def shrink(dim, *names):
    """A mutation: every named tensor with size 0 along `dim`."""
    return replace(**{n: (lambda a, n=n: a[n].narrow(dim, 0, 0)) for n in names})


def linear_input_cases(token_tensors, key_tensors) -> list[Case]:
    """The refusals every linear family shares, for a good call with q, k [1, 8, 2, 16], v [1, 8, 2, 12]
    and an fp32 initial_state [1, 2, 16, 12]: mismatched q/k/v, state shapes and dtypes, empty sizes,
    the scale and output_final_state. token_tensors: every [B, T, H, ...] argument; key_tensors: those
    whose last dim is K."""
    return [
        Case("mixed-dtypes", replace(k=lambda a: a["k"].half()), TypeError, "q, k, v must share one dtype"),
        Case("k-length", replace(k=lambda a: a["k"][:, :4]), ValueError, r"k must be \[B, T, H, K\] = \[1, 8, 2, 16\]"),
        Case("v-length", replace(v=lambda a: a["v"][:, :4]), ValueError, r"v must be \[B, T, H, V\] = \[1, 8, 2, 12\]"),
        Case("v-heads", replace(v=lambda a: a["v"][:, :, :1]), ValueError, r"v must have as many heads as q \(H = 2\)"),
        Case("v-grouped-heads", replace(v=lambda a: torch.cat([a["v"], a["v"]], dim=2)), ValueError,
             r"v must have as many heads as q \(H = 2\), got 4 .*grouped value heads \(fla's num_v_heads\) are "
             r"not supported"),
        Case("initial_state-shape", replace(initial_state=lambda a: a["initial_state"][:, :1]), ValueError,
             r"initial_state must be \[B, H, K, V\] = \[1, 2, 16, 12\]"),
        Case("initial_state-transposed", replace(initial_state=lambda a: a["initial_state"].transpose(-1, -2)),
             ValueError, r"initial_state must be \[B, H, K, V\]"),
        Case("initial_state-int", replace(initial_state=lambda a: a["initial_state"].int()), TypeError,
             "initial_state has dtype int32"),
        Case("initial_state-fp16", replace(initial_state=lambda a: a["initial_state"].half()), TypeError,
             "initial_state has dtype float16"),
        Case("empty-batch", shrink(0, *token_tensors, "initial_state"), ValueError, "q must have every size >= 1"),
        Case("empty-length", shrink(1, *token_tensors), ValueError, "q must have every size >= 1"),
        Case("empty-heads", shrink(2, *token_tensors), ValueError, "q must have every size >= 1"),
        Case("empty-K", shrink(3, *key_tensors), ValueError, "q must have every size >= 1"),
        Case("empty-V", shrink(3, "v"), ValueError, "v must have every size >= 1"),
        Case("scale-bool", replace(scale=lambda a: True), TypeError, "scale must be a float"),
        Case("scale-str", replace(scale=lambda a: "0.5"), TypeError, "scale must be a float"),
        Case("scale-zero", replace(scale=lambda a: 0.0), ValueError, "scale must be finite and > 0"),
        Case("scale-negative", replace(scale=lambda a: -0.5), ValueError, "scale must be finite and > 0"),
        Case("scale-nan", replace(scale=lambda a: math.nan), ValueError, "scale must be finite and > 0"),
        Case("scale-inf", replace(scale=lambda a: math.inf), ValueError, "scale must be finite and > 0"),
        Case("output_final_state-int", replace(output_final_state=lambda a: 1), TypeError,
             "output_final_state must be a bool"),
        Case("output_final_state-None", replace(output_final_state=lambda a: None), TypeError,
             "output_final_state must be a bool"),
    ]


def linear_kernel_cases(key_tensors) -> list[Case]:
    """What the Triton forms refuse beyond `linear_input_cases` (the references accept both): an fp64
    state, and head dims past what a program holds in registers. key_tensors: those whose last dim is K."""
    return [
        Case("initial_state-float64", replace(initial_state=lambda a: a["initial_state"].double()), TypeError,
             "initial_state has dtype float64"),
        Case("head-dim-too-big", replace(**{n: (lambda a: torch.zeros(1, 8, 2, 272, device=DEVICE))
                                            for n in key_tensors}, initial_state=lambda a: None),
             ValueError, "head dims K=272, V=12 must be at most 256"),
    ]


def linear_step_cases() -> list[Case]:
    """What every family's PyTorch decode step refuses, for a good step with q, k [1, 2, 16], v [1, 2, 12]
    and an fp32 state [1, 2, 16, 12]."""
    return [
        Case("state-missing", replace(state=lambda a: None), TypeError, "state must be a torch.Tensor"),
        Case("state-fp16", replace(state=lambda a: a["state"].half()), TypeError, "state has dtype float16"),
        Case("state-shape", replace(state=lambda a: a["state"][:, :1]), ValueError, r"state must be \[B, H, K, V\]"),
        Case("mixed-dtypes", replace(v=lambda a: a["v"].half()), TypeError, "q, k, v must share one dtype"),
        Case("k-heads", replace(k=lambda a: a["k"][:, :1]), ValueError, r"k must be \[B, H, K\] = \[1, 2, 16\]"),
        Case("v-batch", replace(v=lambda a: torch.cat([a["v"], a["v"]])), ValueError, r"v must be \[B, H, V\]"),
        Case("empty-V", shrink(2, "v"), ValueError, "v must have every size >= 1"),
        Case("scale-str", replace(scale=lambda a: "0.5"), TypeError, "scale must be a float"),
        Case("scale-nan", replace(scale=lambda a: math.nan), ValueError, "scale must be finite and > 0"),
    ]


# o_t depends on tokens j <= t only. A NaN or inf at token t must reach exactly what the math says
# (later rows of that head: every value channel for a key or a query, one for a value) and nothing
# earlier, in particular not the earlier rows of t's chunk, which share the intra-chunk products.
POISONS = {"nan-in-k": ("k", math.nan), "inf-in-k": ("k", math.inf), "nan-in-v": ("v", math.nan),
           "inf-in-v": ("v", math.inf), "nan-in-q": ("q", math.nan)}


# inputs whose poison reaches every value channel of the rows at and after it: the keys, and the gates
# and write strengths that scale them (KDA's g and β); a query reaches its own row alone, a value its channel
KEY_LIKE = ("k", "g", "gk", "beta")


def poison(args: dict, name: str, value: float, token: int) -> dict:
    """Put `value` at channel 3 of head 0 of `token` in args[name] (at head 0 of `token` for a
    [B, T, H] tensor such as β); return the same arguments with a 0 there instead (for the reference)."""
    where = (slice(None), token, 0) + ((3,) if args[name].dim() == 4 else ())
    clean = {**args, name: args[name].clone()}
    clean[name][where] = 0.0
    args[name][where] = value
    return clean


def assert_poison_pattern(o, S, o_ref, name: str, token: int) -> None:
    """o non-finite exactly where a poison in `name` at `token` (channel 3, head 0) must reach, equal to
    the reference on the clean input everywhere else; head 1's final state S untouched."""
    poisoned = torch.zeros_like(o, dtype=torch.bool)
    if name == "v":
        poisoned[:, token:, 0, 3] = True         # S[:, 3] carries it to every later row, channel 3 only
    elif name in KEY_LIKE:
        poisoned[:, token:, 0, :] = True         # S[3, :] (the delta rule: all of S) carries it on
    else:
        poisoned[:, token, 0, :] = True          # q_t is read by row t alone
    bad = ~torch.isfinite(o)
    assert torch.equal(bad, poisoned), f"non-finite at {sorted(set(bad.nonzero()[:, 1].tolist()))}, " \
                                       f"expected rows {sorted(set(poisoned.nonzero()[:, 1].tolist()))}"
    assert_close(o[~poisoned], o_ref[~poisoned], tolerance(torch.float32), "the rows that cannot see the poison")
    assert torch.isfinite(S[:, 1]).all(), "head 1 never saw the poison"


def assert_inf_in_v(o, o_exact, token: int, exact: bool) -> None:
    """K = V = 1 and +inf in v at `token`: the math gives ±inf from there on (the delta rule: ±inf at
    `token`, then inf - inf). A recurrent form (exact) must match o_exact, the same infinities and NaN
    included; a chunk form may give NaN at and after `token` (its products cannot tell ±inf apart), but
    must match before it."""
    o_exact = o_exact.to(o.dtype)
    if exact:
        torch.testing.assert_close(o, o_exact, equal_nan=True, rtol=1e-5, atol=1e-6)
        assert not torch.isfinite(o[:, token]).any(), "the inf's own row"
    else:
        assert not torch.isfinite(o[:, token:]).any(), "the rows at and after the inf"
    assert torch.isfinite(o[:, :token]).all(), "the inf reached an earlier token"
    assert_close(o[:, :token], o_exact[:, :token], tolerance(torch.float32), "the rows before the inf")


class RecordingKernel:
    """A kernel whose launches record their grid (or, given `meta`, that keyword argument), then run."""
    def __init__(self, kernel, grids, meta=None):
        self.kernel, self.grids, self.meta = kernel, grids, meta

    def __getitem__(self, grid):
        if self.meta is None:
            self.grids.append(tuple(grid))
            return self.kernel[grid]

        def launch(*args, **kwargs):
            self.grids.append(kwargs[self.meta])
            return self.kernel[grid](*args, **kwargs)
        return launch
