"""Lines of code of the same kernel in several languages: the book's MLA decode in Triton, Gluon and
TileLang, its GLA chunk prefill in Triton and TileLang, its Mamba-2 kernels in Triton, and, where their
source is on this machine, the peers' own (FlashMLA's CUDA decode, mamba_ssm's Triton SSD and state
update). No GPU, nothing imported: the files are read and parsed.

    >>> loc_table()                        # one row per (kernel, language, source)
    >>> count_python("attention_kernels/mla/decode.py")
    Lines(kernel=..., host=..., total=...)

A line counts when it holds code: not blank, not only a comment, not inside a docstring (a string that
is a statement of its own). A Python file is split with `ast` into
- kernel: the device code, every top-level function that is, or holds, a function decorated `jit` or
  `prim_func` (triton.jit, gluon.jit, TileLang's T.prim_func inside its kernel builders), decorators
  included;
- host: every other top-level function or class (launch wrappers, allocation, autograd Functions);
- total: every counted line of the file (imports and module constants too).
A C++/CUDA file has no such split here: FlashMLA's device files count as kernel, its host API file as
host. Library code the kernels include (CUTLASS, CuTe, FlashMLA's kerutils) is not counted.
"""
from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import tokenize
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]  # the repository: the book's files are read from it
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENDMARKER, tokenize.ENCODING}
_DEVICE_DECORATORS = {"jit", "prim_func"}


@dataclasses.dataclass(frozen=True)
class Lines:
    """Counted lines of code: in device code, in host code, in the whole file (or files)."""
    kernel: int
    host: int
    total: int

    def __add__(self, other: Lines) -> Lines:
        return Lines(self.kernel + other.kernel, self.host + other.host, self.total + other.total)


def _python_code_lines(source: str, tree: ast.Module) -> set[int]:
    """The numbers of the lines that hold code: covered by a token that is not a comment or layout,
    outside every string that is a statement of its own."""
    lines = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.difference_update(range(node.lineno, node.end_lineno + 1))
    return lines


def _decorator_name(decorator: ast.expr) -> str:
    """`jit` for @triton.jit, @gluon.jit(...), @jit; `prim_func` for @T.prim_func."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")


def _is_device(node: ast.AST) -> bool:
    """Whether a top-level definition is device code: it, or a function inside it, is decorated jit or
    prim_func."""
    return any(isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(_decorator_name(d) in _DEVICE_DECORATORS for d in inner.decorator_list)
               for inner in ast.walk(node))


def count_python(path) -> Lines:
    """Lines of code of one Python file, its device code and its host code apart (see the module's
    docstring for what counts)."""
    source = Path(path).read_text(encoding="utf-8")
    tree = ast.parse(source)
    code = _python_code_lines(source, tree)
    kernel, host = set(), set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            (kernel if _is_device(node) else host).update(range(first, node.end_lineno + 1))
    return Lines(len(code & kernel), len(code & host), len(code))


# a comment or a string literal of C++/CUDA: strings are matched so that a // inside one is not a comment
_C_COMMENT_OR_STRING = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def count_c(path) -> int:
    """Lines of code of one C++/CUDA file: lines left holding something once comments are removed."""
    def blank_comment(match):
        text = match.group(0)
        return text if text[0] in "\"'" else re.sub(r"[^\n]", " ", text)   # a block comment keeps its newlines
    stripped = _C_COMMENT_OR_STRING.sub(blank_comment, Path(path).read_text(encoding="utf-8", errors="replace"))
    return sum(1 for line in stripped.splitlines() if line.strip())


@dataclasses.dataclass(frozen=True)
class Source:
    """One implementation of a kernel: its files, relative to `where` ("book": the repository; a peer's
    name: that peer's source folder, see `peer_folder`). A Python file is split by `count_python`; C++/CUDA
    files count whole, as device code (`device`) or as host code (`host`)."""
    kernel: str
    language: str
    where: str
    python: tuple[str, ...] = ()
    device: tuple[str, ...] = ()
    host: tuple[str, ...] = ()

    def files(self) -> tuple[str, ...]:
        return self.python + self.device + self.host


_SSD = ("ssd_bmm.py", "ssd_chunk_state.py", "ssd_state_passing.py", "ssd_chunk_scan.py", "ssd_combined.py")
_FLASHMLA_DENSE, _FLASHMLA_SMXX = "csrc/sm90/decode/dense", "csrc/smxx/decode"

SOURCES = [
    Source("MLA decode", "Triton", "book", python=("attention_kernels/mla/decode.py",)),
    Source("MLA decode", "Gluon", "book", python=("attention_kernels/mla/gluon_decode.py",)),
    Source("MLA decode", "TileLang", "book", python=("attention_kernels/mla/tilelang_decode.py",)),
    Source("MLA decode", "CUDA (CuTe)", "FlashMLA",
           device=(f"{_FLASHMLA_DENSE}/splitkv_mla.cuh", f"{_FLASHMLA_DENSE}/traits.h", f"{_FLASHMLA_DENSE}/config.h",
                   f"{_FLASHMLA_SMXX}/combine/combine.cu",
                   f"{_FLASHMLA_SMXX}/get_decoding_sched_meta/get_decoding_sched_meta.cu"),
           host=("csrc/api/dense_decode.h",)),
    # GLA's chunked forward: its scores kernel with the chunk kernels the linear families share (those also
    # carry Lightning's and KDA's options), and the TileLang form, which does the same in two kernels
    Source("GLA chunk prefill", "Triton", "book",
           python=("attention_kernels/gla/chunk.py", "attention_kernels/linear/chunk.py")),
    Source("GLA chunk prefill", "TileLang", "book", python=("attention_kernels/gla/tilelang_chunk.py",)),
    Source("Mamba-2 SSD chunk scan", "Triton", "book", python=("attention_kernels/mamba2/chunk.py",)),
    Source("Mamba-2 SSD chunk scan", "Triton", "mamba_ssm", python=tuple(f"mamba_ssm/ops/triton/{f}" for f in _SSD)),
    Source("Mamba-2 decode step", "Triton", "book", python=("attention_kernels/mamba2/decode.py",)),
    Source("Mamba-2 decode step", "Triton", "mamba_ssm",
           python=("mamba_ssm/ops/triton/selective_state_update.py",)),
]

# where each peer's source may be: the variable the benchmarks read, the ignored folder of a checkout that
# carries it, and the shared folder beside the checkout
_PEER_FOLDERS = {
    "FlashMLA": ("FLASHMLA_PATH", ".peers-flashmla/flashmla_src", "shared/peers/flashmla/flashmla_src"),
    "mamba_ssm": ("MAMBA_SSM_PATH", ".peers-mamba_ssm", "shared/peers/mamba_ssm"),
}


def peer_folder(peer: str) -> Path | None:
    """The folder holding a peer's source on this machine, or None where it is not here: the environment
    variable its benchmarks read, else an ignored folder of this checkout, else ../shared/peers beside it."""
    variable, in_checkout, beside = _PEER_FOLDERS[peer]
    candidates = [os.environ.get(variable), ROOT / in_checkout, ROOT.parent / beside]
    return next((Path(c) for c in candidates if c and Path(c).is_dir()), None)


def count(source: Source) -> Lines | None:
    """The lines of one implementation; None where a peer's files are not on this machine."""
    folder = ROOT if source.where == "book" else peer_folder(source.where)
    if folder is None or not all((folder / f).is_file() for f in source.files()):
        return None
    lines = Lines(0, 0, 0)
    for f in source.python:
        lines += count_python(folder / f)
    for f in source.device:
        n = count_c(folder / f)
        lines += Lines(n, 0, n)
    for f in source.host:
        n = count_c(folder / f)
        lines += Lines(0, n, n)
    return lines


def loc_table(sources=SOURCES) -> pd.DataFrame:
    """Lines of code per implementation: kernel (device code), host (launch wrappers and the rest of the
    host code), total (whole files), and how many files (`SOURCES` names them). A peer whose source is not
    here reads "n/a"."""
    rows = []
    for source in sources:
        lines = count(source)
        numbers = dataclasses.asdict(lines) if lines else dict.fromkeys(("kernel", "host", "total"), "n/a")
        rows.append({"kernel": source.kernel, "language": source.language, "source": source.where,
                     "kernel lines": numbers["kernel"], "host lines": numbers["host"],
                     "all lines": numbers["total"],
                     "files": len(source.files())})
    return pd.DataFrame(rows).set_index(["kernel", "language", "source"])


__all__ = ["Lines", "Source", "SOURCES", "count", "count_c", "count_python", "loc_table", "peer_folder"]
