"""Triton device functions kept apart from any one family's kernels: masking that lets nothing through
(softmax families use `dot_visible`, the chunked linear families `dot_causal`), and the row
log-sum-exp with IEEE's special values kept.

Why `dot_visible` and `dot_causal`: a mask sets a probability (or a causal score) to exactly 0, but 0 * NaN is NaN, so
a product P @ V still carries a NaN or inf that sits in V at a masked position into every row of the
tile. Serving caches hold garbage past each length, and a NaN must not travel backwards in time.
"""
import triton
import triton.language as tl


@triton.jit
def dot_visible(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b, where a term with a[i, j] == 0 adds nothing even if row j of b holds NaN or inf.

    a: [M, N] (zero where masked), b: [N, D], acc: fp32 [M, D]. When b is finite (always, in
    practice) this is one `tl.dot`; the check costs one pass over the b tile. Otherwise rows that
    see a non-finite row of b take the plain product (IEEE: NaN or inf, as the math says) and the
    other rows the product with those rows of b zeroed.
    """
    b_ok = tl.abs(b.to(tl.float32)) < float("inf")           # False for NaN and +-inf
    key_bad = tl.max(tl.where(b_ok, 0, 1), axis=1)             # [N]: row j of b holds a non-finite value
    if tl.max(key_bad, axis=0) > 0:
        row_sees_bad = tl.max(tl.where(a != 0, key_bad[None, :], 0), axis=1)   # [M]
        raw = tl.dot(a, b, acc, input_precision=PRECISION)
        clean = tl.dot(a, tl.where(b_ok, b, 0.0).to(b.dtype), acc, input_precision=PRECISION)
        out = tl.where(row_sees_bad[:, None] > 0, raw, clean)
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def dot_causal(a, b, acc, PRECISION: tl.constexpr):
    """acc + a @ b for a causal (lower-triangular) a: a[i, j] = 0 for j > i, with rows of a and b
    indexed by the same positions (a chunk's tokens). A NaN or inf at b[j, d] reaches column d of
    rows i >= j, as NaN (the recurrence these products come from carries it on, even through a zero
    gate), and no earlier row.

    a: [N, N], b: [N, D], acc: fp32 [N, D]. One `tl.dot` on b with its non-finite values zeroed, no
    extra accumulator: the check costs one pass over the b tile and one select on the result.
    """
    o_n = tl.arange(0, b.shape[0])
    b_ok = b * 0.0 == 0.0                                                          # False for NaN, +-inf
    first_bad = tl.min(tl.where(b_ok, b.shape[0], o_n[:, None]), axis=0)          # [D]; N where none
    out = tl.dot(a, tl.where(b_ok, b, 0.0).to(b.dtype), acc, input_precision=PRECISION)
    return tl.where(o_n[:, None] >= first_bad[None, :], float("nan"), out)


@triton.jit
def log2_sum_exp2(m, l):
    """A row's base-2 log-sum-exp from its running max m and sum l = sum exp2(s - m).

    -inf for a row that saw nothing (l = 0), +inf for a row with a +inf score, NaN for a row with a
    NaN score (l is NaN then): never -inf, which would read as "saw nothing", for a row that saw NaN.
    """
    safe = tl.where(l > 0, l, 1.0)
    lse = tl.where(l > 0, m + tl.log2(safe), tl.where(l == 0, float("-inf"), float("nan")))
    return tl.where(m == float("inf"), float("inf"), lse)
