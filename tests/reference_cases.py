"""What the FlashAttention tests of the output and its gradients share: each result against its reference
(autograd through the formula in fp64 or fp32), by name, with its own tolerance; and the NaN and inf cases where
the causal mask hides them (the Triton and the Gluon backward's tests), with the rows each may reach.

    >>> assert_matches_reference(("o", "dq", "dk", "dv"), (o, *grads), refs, (tol_f, tol_b, tol_b, tol_b))
    >>> compare_rows("dq", dq, dq_ref, on_heads(rows_seeing_key(T, S, key), heads), tol_b)
"""
from __future__ import annotations

import math

import torch

from attention_kernels.common import rel_err
from attention_kernels.flash_attn import causal_mask


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


# ------------------------------------------------------------------ NaN and inf where the causal mask hides them
# A value in K or V at one key of KV head 0 (feature 3): (shape (B, T, S, HQ, HKV, D), the key), and the poisons
HIDDEN_KEY_CASES = [
    ((1, 70, 70, 4, 2, 32), 69), ((1, 70, 70, 4, 2, 32), 35),
    ((1, 40, 100, 2, 1, 32), 99), ((1, 40, 100, 2, 1, 32), 75),
    ((1, 100, 40, 2, 2, 64), 39), ((1, 100, 40, 2, 2, 64), 10),
]
KEY_POISONS = ("nan-in-k", "nan-in-v", "inf-in-v")
# A NaN in Q or dO at one query row of query head 0 (feature 3): (shape, the row), and the poisons
HIDDEN_QUERY_CASES = [((1, 70, 70, 4, 2, 32), 20), ((1, 100, 40, 2, 2, 64), 75)]
ROW_POISONS = ("nan-in-q", "nan-in-do")


def poison_key(k, v, key: int, poison: str) -> None:
    """Write `poison` (one of KEY_POISONS) into K or V at `key` of KV head 0, feature 3, in place."""
    with torch.no_grad():
        (k if poison == "nan-in-k" else v)[:, key, 0, 3] = math.inf if poison == "inf-in-v" else math.nan


def poison_row(q, do, row: int, poison: str) -> None:
    """Write a NaN (`poison` one of ROW_POISONS) into Q or dO at query `row` of head 0, feature 3, in place."""
    with torch.no_grad():
        (q if poison == "nan-in-q" else do)[:, row, 0, 3] = math.nan


def on_heads(positions, heads):
    """Bool [1, n, H]: the positions (bool [n]) on the heads (bool [H]) where heads holds True."""
    return positions[None, :, None] & heads[None, None, :]


def rows_seeing_key(T: int, S: int, key: int, device=None):
    """Bool [T]: the query rows that see `key` under the causal mask (bottom-right aligned)."""
    return causal_mask(T, S, device=device)[:, key]


def keys_seen_by(T: int, S: int, rows, device=None):
    """Bool [S]: the keys that any of `rows` (bool [T]) sees under the causal mask."""
    return causal_mask(T, S, device=device)[rows].any(dim=0)


def compare_rows(name, out, ref, poisoned, tol, both_sides: bool = True) -> None:
    """Non-finite exactly where `poisoned` ([B, rows, H]) says, and close to `ref` everywhere else. both_sides:
    the case must have poisoned and clean rows (else a clean side may be empty)."""
    bad = ~torch.isfinite(out).all(dim=-1)
    assert torch.equal(bad, poisoned), f"{name}: non-finite rows {bad.nonzero().tolist()}, " \
                                       f"expected {poisoned.nonzero().tolist()}"
    if both_sides:
        assert poisoned.any() and not poisoned.all(), "the case must have rows on both sides"
    if not poisoned.all():
        err = rel_err(out[~poisoned], ref[~poisoned])
        assert err <= tol, f"{name}: relative error {err:.2e} > {tol:.0e} on the rows that cannot see the poison"


def compare_poisoned_row(grads, refs, T: int, S: int, HQ: int, HKV: int, row: int, poison: str, tol):
    """After `poison_row` at `row` of query head 0: dq non-finite at that row alone, and dv (a NaN in Q) or dk
    (a NaN in dO) non-finite at exactly the keys the row sees in KV head 0; each close to its reference
    elsewhere. Returns the row's mask [1, T, HQ] (o's check in the forward uses it)."""
    (dq, dk, dv), (dq_ref, dk_ref, dv_ref) = grads, refs
    dev = dq.device
    at_row = on_heads(torch.arange(T, device=dev) == row, torch.arange(HQ, device=dev) == 0)
    compare_rows("dq", dq, dq_ref, at_row, tol)
    seen = on_heads(keys_seen_by(T, S, at_row[0, :, 0], dev), torch.arange(HKV, device=dev) == 0)
    if poison == "nan-in-q":
        compare_rows("dv", dv, dv_ref, seen, tol)
    else:
        compare_rows("dk", dk, dk_ref, seen, tol)
    return at_row
