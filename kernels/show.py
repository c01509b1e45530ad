"""Show the package's own code in a notebook, highlighted, instead of redefining it."""
import inspect

from IPython.display import Code


def show_source(obj) -> Code:
    """Return the source of a function, class or module as a highlighted Python block.

    Triton kernels are unwrapped first, so `show_source(_attn_fwd_kernel)` shows the
    `@triton.jit` function as written, decorators included.
    """
    target = getattr(obj, "fn", obj)  # triton JITFunction / Autotuner / Heuristics wrap .fn
    while hasattr(target, "fn") and not inspect.isfunction(target):
        target = target.fn
    return Code(inspect.getsource(target), language="python")
