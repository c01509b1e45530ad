"""The package as a reader installs it: the wheel declares everything the package imports, and a wheel built
from this tree, installed with nothing but its declared dependencies, runs a call of every family.

The fresh environment is a new venv whose site-packages holds the wheel and links to the declared
dependencies (and theirs) as this Python has them installed: no network, no second copy of torch.
"""
import ast
import importlib.metadata as metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The module only notebooks use: it needs the [notebooks] extra (IPython, ipywidgets).
NOTEBOOK_MODULES = {"attention_kernels.notebook"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared(extra: str | None = None) -> set[str]:
    found = {_name(r) for r in PROJECT["dependencies"]}
    if extra:
        found |= {_name(r) for r in PROJECT["optional-dependencies"][extra]}
    return found


def _imports(path: Path) -> set[str]:
    """Top-level names of the absolute imports in one file (lazy ones inside functions included)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"attention_kernels"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_package_declares_everything_it_imports():
    """Every import in attention_kernels/ is a declared dependency: of the package itself, or of the [notebooks] extra
    for the modules only notebooks use. (The peers are imported by name, guarded, in attention_kernels.peers.)"""
    distributions = metadata.packages_distributions()
    core, notebooks = _declared(), _declared("notebooks")
    problems = []
    for path in sorted((ROOT / "attention_kernels").rglob("*.py")):
        allowed = notebooks if _module_name(path) in NOTEBOOK_MODULES else core
        for name in sorted(_imports(path)):
            dists = {d.lower().replace("_", "-") for d in distributions.get(name, [name])}
            if not dists & allowed:
                problems.append(f"{path.relative_to(ROOT)} imports {name} ({', '.join(sorted(dists))}), "
                                f"which pyproject.toml does not declare there")
    assert not problems, "\n".join(problems)


def _closure(requirements: list[str]) -> list[metadata.Distribution]:
    """The installed distributions the requirements need, with their own requirements, markers evaluated here.
    Skips when this environment holds a declared dependency outside its declared range (a GPU box's own numpy,
    say): the test is of the wheel with what it declares."""
    from packaging.requirements import Requirement

    for text in requirements:
        req = Requirement(text)
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{req.name} is declared but not installed here: install the book's requirements first")
        if not req.specifier.contains(have, prereleases=True):
            pytest.skip(f"this environment has {req.name} {have}, outside the declared {req}")
    seen, todo, found = set(), [_name(r) for r in requirements], []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            pytest.fail(f"{name} is declared but not installed here: install the book's requirements first")
        found.append(dist)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return found


# One call of every family on the CPU, under the interpreter, from the installed wheel.
_SMOKE = r'''
import importlib, pkgutil, sys
import torch
import attention_kernels
assert attention_kernels.__file__.startswith(sys.argv[1]), attention_kernels.__file__
notebook_only = set(sys.argv[2].split(","))
for m in pkgutil.walk_packages(attention_kernels.__path__, "attention_kernels."):
    if m.name not in notebook_only:
        importlib.import_module(m.name)
from attention_kernels.bench import discover, run, sweep
assert discover()

from attention_kernels.primer import vector_add
from attention_kernels.flash_attn import flash_attn_func
from attention_kernels.mla import mla_decode
from attention_kernels.gla import chunk_gla
from attention_kernels.lightning import chunk_lightning, lightning_slopes
from attention_kernels.kda import chunk_kda
from attention_kernels.mamba2 import selective_state_update, ssd_chunk_scan
from attention_kernels.ring import ring_attention_simulated
r = torch.randn
B, T, H, K = 1, 20, 2, 16
x = r(100)
assert torch.equal(vector_add(x, x), x + x)
q = r(B, T, H, 32)
assert flash_attn_func(q, q, q, causal=True).shape == q.shape
lens = torch.tensor([30], dtype=torch.int32)
out, lse = mla_decode(r(1, 1, 4, 64), r(1, 30, 64), None, lens, 48, 0.1)
assert out.shape == (1, 1, 4, 48)
q, k, v = r(B, T, H, K), r(B, T, H, K), r(B, T, H, K)
g = -torch.rand(B, T, H, K)
assert chunk_gla(q, k, v, g)[0].shape == v.shape
assert chunk_lightning(q, k, v, lightning_slopes(H))[0].shape == v.shape
assert chunk_kda(q, k, v, g, torch.rand(B, T, H), use_qk_l2norm_in_kernel=True)[0].shape == v.shape
P, N = 8, 16
xs, dt, A = r(B, T, H, P), torch.rand(B, T, H), -torch.rand(H)
assert ssd_chunk_scan(xs, dt, A, r(B, T, 1, N), r(B, T, 1, N)).shape == xs.shape
state = r(B, H, P, N)
y = selective_state_update(state, r(B, H, P), torch.rand(B, H, P), -torch.rand(H, P, N), r(B, 1, N), r(B, 1, N))
assert y.shape == (B, H, P)
assert ring_attention_simulated(q, k, v, causal=True, world=2)[0].shape == v.shape
print("every family ran")
'''


def test_the_wheel_runs_with_only_its_declared_dependencies(tmp_path):
    pytest.importorskip("setuptools")
    pytest.importorskip("packaging")
    src = tmp_path / "src"  # a scratch copy: building leaves build/ and egg-info behind, not in the tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "attention_kernels", src / "attention_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("attention_kernels_book-*.whl"))

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for dist in _closure(PROJECT["dependencies"]):
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    with zipfile.ZipFile(wheel) as whl:
        whl.extractall(site)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TRITON_", "CUDA_VISIBLE"))}
    env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    ran = subprocess.run([str(python), "-I", "-c", _SMOKE, str(site), ",".join(sorted(NOTEBOOK_MODULES))],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "every family ran" in ran.stdout


# ------------------------------------------------------------------ no module reads another's private names
# Known today, each named with why it stays for now; nothing else may join them.
PRIVATE_ACROSS_MODULES = {
    ("attention_kernels/flash_attn/diagram.py", "_key_ranges"): "the FA forward's key ranges, drawn as the causal tiles",
    ("attention_kernels/flash_attn/backward.py", "_key_ranges"): "the causal key ranges the forward and backward share",
    ("attention_kernels/mamba2/chunk.py", "_softplus"): "the step's softplus, shared by the chunk scan",
    ("attention_kernels/ring/interface.py", "_one_launch"): "FlashAttention's backward launch choice, per ring step",
    ("scripts/mla_gluon_compile.py", "_mla_decode_ws_kernel"): "compiles the Gluon MLA kernel alone (ptxas)",
    ("scripts/flash_attn_decode_compile.py", "_decode_split_kernel"): "compiles the FA decode kernel alone (ptxas)",
    ("scripts/ssd_state_compile.py", "_ssd_chunk_state_kernel"): "compiles the SSD state kernels alone (ptxas)",
    ("scripts/ssd_state_compile.py", "_ssd_state_pass_kernel"): "compiles the SSD state kernels alone (ptxas)",
    ("scripts/ssd_state_compile.py", "_CHUNK_STATE_CONFIGS"): "compiles each of the chunk-state kernel's configs",
    ("scripts/ssd_state_compile.py", "_PASS_BLOCK"): "compiles the state walk at its launch tile",
    ("scripts/ssd_state_compile.py", "_PASS_WARPS"): "compiles the state walk at its launch warps",
    ("scripts/mla_tilelang_compile.py", "_decode_kernel"): "compiles the TileLang MLA kernels alone",
    ("scripts/mla_tilelang_compile.py", "_merge_kernel"): "compiles the TileLang MLA kernels alone",
    ("scripts/linear_bwd_compile.py", "_chunk_gla_scores_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_local_cumsum_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_state_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_dqk_intra_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_dqk_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_dv_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_chunk_state_grad_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_ssd_dqk_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_ssd_gate_grad_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_ssd_gates_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_ssd_state_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_PER_CHANNEL_WARPS"): "compiles each kernel at its launch warps",
    ("scripts/linear_bwd_compile.py", "_INTRA_STAGES"): "compiles the sub-chunk kernel at its launch stages",
    ("scripts/linear_bwd_compile.py", "_INTRA_WARPS"): "compiles the sub-chunk kernel at its launch warps",
    ("scripts/linear_bwd_compile.py", "_INTRA_BK"): "compiles the sub-chunk kernel at its launch key tile",
    ("scripts/linear_bwd_compile.py", "_kda_chunk_grad_kernel"): "compiles KDA's backward kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_delta_state_grad_halves_kernel"): "compiles the experiment alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_DELTA_HALVES_CONFIG"): "compiles the key halves' pass at its launch config",
    ("scripts/linear_bwd_compile.py", "_kda_dqk_combine_kernel"): "compiles KDA's backward kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_kda_wy_kernel"): "compiles KDA's solve kernel alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_GRAD_BK"): "compiles KDA's chunk kernel at its launch tiles",
    ("scripts/linear_bwd_compile.py", "_GRAD_BV"): "compiles KDA's chunk kernel at its launch tiles",
    ("scripts/linear_bwd_compile.py", "_GRAD_WARPS"): "compiles KDA's chunk kernel at its launch warps",
    ("scripts/linear_bwd_compile.py", "_COMBINE_ROWS"): "compiles KDA's combine kernel at its launch row block",
    ("scripts/linear_bwd_compile.py", "_COMBINE_WARPS"): "compiles KDA's combine kernel at its launch warps",
    ("scripts/linear_bwd_compile.py", "_sum_precision"): "compiles the gate's sums at the precision a launch picks",
    ("scripts/linear_bwd_compile.py", "_DQK_BK"): "compiles Mamba-2's dq/dk kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_BV"): "compiles Mamba-2's dq/dk kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_HEADS"): "compiles Mamba-2's dq/dk kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_STAGES"): "compiles Mamba-2's dq/dk kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_WARPS"): "compiles Mamba-2's dq/dk kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_TAIL_WARPS"): "compiles the elementwise kernels at their launch warps",
    ("scripts/linear_bwd_compile.py", "_ssd_dqk_intra_kernel"): "compiles the backward's kernels alone (ptxas)",
    ("scripts/linear_bwd_compile.py", "_DQK_INTRA_BK"): "compiles Mamba-2's dq/dk intra kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_INTRA_STAGES"): "compiles Mamba-2's dq/dk intra kernel at its launch tile",
    ("scripts/linear_bwd_compile.py", "_DQK_INTRA_WARPS"): "compiles Mamba-2's dq/dk intra kernel at its launch tile",
    ("scripts/gla_tilelang_compile.py", "_state_kernel"): "compiles the TileLang GLA kernels alone",
    ("scripts/gla_tilelang_compile.py", "_output_kernel"): "compiles the TileLang GLA kernels alone",
    ("scripts/mla_replay_check.py", "_paged_case"): "replays the MLA benchmark's own cases",
    ("scripts/mla_replay_check.py", "_paged_inputs"): "replays the MLA benchmark's own inputs",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reads(root: Path, folders=("attention_kernels", "scripts")) -> list[tuple[str, str, str]]:
    """(file, private name, how) for every read of a module's private name from another module of the tree:
    `from x import _y`, `x._y` on a module x, `getattr(x, "_y")` and `importlib.import_module("x")._y`.
    Modules outside the tree (torch, triton) are not this test's business."""
    def module_name(path):
        parts = path.relative_to(root).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    def in_tree(dotted):
        where = root.joinpath(*dotted.split("."))
        return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()

    found = []
    for path in sorted(p for folder in folders for p in (root / folder).rglob("*.py")):
        rel, me = path.relative_to(root).as_posix(), module_name(path)
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        tree = ast.parse(path.read_text())
        modules = {}  # a local name -> the module of the tree it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    if in_tree(f"{source}.{alias.name}"):
                        modules[alias.asname or alias.name] = f"{source}.{alias.name}"
                    elif _private(alias.name) and in_tree(source) and source != me:
                        found.append((rel, alias.name, f"from {source} import {alias.name}"))

        def module_of(node):
            """The module of the tree an expression names (x, x.y, importlib.import_module("x")), or None."""
            if isinstance(node, ast.Name):
                return modules.get(node.id)
            if isinstance(node, ast.Attribute):
                base = module_of(node.value)
                return f"{base}.{node.attr}" if base and in_tree(f"{base}.{node.attr}") else None
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None))
                    in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant)):
                return node.args[0].value
            return None

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = module_of(node.value)
                if owner and owner != me and in_tree(owner):
                    found.append((rel, node.attr, f"{owner}.{node.attr}"))
            elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
                  and _private(node.args[1].value)):
                owner = module_of(node.args[0])
                if owner and owner != me and in_tree(owner):
                    found.append((rel, node.args[1].value, f"getattr({owner}, {node.args[1].value!r})"))
    return found


def test_no_module_reads_another_modules_private_names():
    """attention_kernels/ and scripts/ use each other's public names only; the known exceptions are named, each with its
    reason, and one that is gone must leave the list too."""
    found = _private_reads(ROOT)
    new = sorted({f"{file}: {how}" for file, name, how in found if (file, name) not in PRIVATE_ACROSS_MODULES})
    assert not new, "private names read across modules (make them public, or keep them inside):\n" + "\n".join(new)
    gone = sorted(set(PRIVATE_ACROSS_MODULES) - {(file, name) for file, name, _ in found})
    assert not gone, f"no longer read across modules, drop from PRIVATE_ACROSS_MODULES: {gone}"


def test_the_private_name_check_finds_every_form(tmp_path):
    """On a made-up tree: each way of reading another module's private name is found, and what is allowed
    (a module's own private names, dunders, a third-party module's names, an object's attributes) is not."""
    files = {
        "attention_kernels/__init__.py": "",
        "attention_kernels/fam/__init__.py": "from .inner import public\n",
        "attention_kernels/fam/inner.py": "import torch\n_hidden = 1\n\ndef public():\n    return _hidden, torch._C\n",
        "attention_kernels/relative.py": "from .fam.inner import _hidden\n",
        "attention_kernels/absolute.py": "from attention_kernels.fam.inner import public, _hidden as h\n",
        "attention_kernels/attribute.py": "from attention_kernels.fam import inner\nx = inner._hidden\n",
        "attention_kernels/dotted.py": "import attention_kernels.fam.inner\nx = attention_kernels.fam.inner._hidden\n",
        "attention_kernels/aliased.py": "import attention_kernels.fam.inner as m\nx = m._hidden\n",
        "scripts/by_getattr.py": "from attention_kernels.fam import inner\nx = getattr(inner, '_hidden')\n",
        "scripts/by_importlib.py": "import importlib\nx = importlib.import_module('attention_kernels.fam.inner')._hidden\n",
        "scripts/allowed.py": ("import torch\nimport attention_kernels.fam.inner as m\nfrom attention_kernels.fam.inner import public\n"
                               "x = (m.__name__, torch._C, public()._x, getattr(m, 'public'))\n"
                               "class A:\n    def f(self):\n        return self._y\n"),
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = {file for file, name, _ in _private_reads(tmp_path)}
    assert found == {"attention_kernels/relative.py", "attention_kernels/absolute.py", "attention_kernels/attribute.py", "attention_kernels/dotted.py",
                     "attention_kernels/aliased.py", "scripts/by_getattr.py", "scripts/by_importlib.py"}
