"""Gluon device functions shared by the Hopper kernels (`flash_attn/gluon_forward.py`, `flash_attn/gluon_backward.py`,
`mla/gluon_decode.py`). Imported only by those modules, so that the package's Triton paths never need Gluon."""
from triton.experimental import gluon


@gluon.jit
def opaque_zero(t):
    """0 for any t < 2**30 (a tile or loop index), but not provably 0 to LLVM. Shared buffers handed to wgmma
    are indexed with it: a [1, ...] buffer as `q_s.index(opaque_zero(t))`, a ring slot as
    `k_s.index(slot + opaque_zero(t))`. With an index LLVM can see is constant, or a two-valued slot it turns
    into a select, it precomputes every per-k-step wgmma descriptor (64 bits each) outside the loop, and ptxas
    spills them. Computed in the loop, each descriptor is one add next to its wgmma."""
    return t >> 30
