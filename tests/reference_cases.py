"""What the FlashAttention tests of the output and its gradients share: each result against its reference
(autograd through the formula in fp64 or fp32), by name, with its own tolerance.

    >>> assert_matches_reference(("o", "dq", "dk", "dv"), (o, *grads), refs, (tol_f, tol_b, tol_b, tol_b))
"""
from __future__ import annotations

from attention_kernels.common import rel_err


def assert_matches_reference(names, outs, refs, tols) -> None:
    """Each out has no NaN and a relative error against its ref within its tol; where the ref is exactly 0
    (S = 1: a softmax over one key is constant, so dq is exactly 0) no relative error exists, and
    max |out| <= tol instead. The four sequences go in step: one of another length fails."""
    for name, out, ref, tol in zip(names, outs, refs, tols, strict=True):
        assert not out.isnan().any(), f"{name} has NaN"
        if not ref.any():
            assert out.abs().max().item() <= tol, f"{name}: should be 0, max |{name}| = {out.abs().max().item():.2e}"
            continue
        err = rel_err(out, ref)
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e}"
