"""Layout rules: the core stays usable without the UI (no streamlit, no dashboard import in vit_core), and
nothing edits sys.path (everything is imported as installed)."""

import ast
import re
import subprocess
import sys

from conftest import REPO


def test_vit_core_never_imports_streamlit():
    code = (
        "import pkgutil, importlib, sys, vit_core\n"
        "for m in pkgutil.walk_packages(vit_core.__path__, 'vit_core.'):\n"
        "    if not m.name.endswith('__main__'): importlib.import_module(m.name)\n"
        "print('streamlit' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    for path in (REPO / "vit_core").rglob("*.py"):
        assert "import streamlit" not in path.read_text() and "from streamlit" not in path.read_text(), path


def _sources() -> list:
    """The repository's Python files: not build outputs, not hidden folders (.venv, .git, scratch copies)."""
    def ours(parts: tuple[str, ...]) -> bool:
        return not any(part.startswith(".") or part in ("build", "dist") for part in parts)

    return [p for p in REPO.rglob("*.py") if ours(p.relative_to(REPO).parts[:-1])]


def test_dependencies_go_one_way_dashboard_to_vit_core():
    for path in (REPO / "vit_core").rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import) dashboard\b", text, re.MULTILINE), path


def test_nothing_edits_sys_path():
    """The packages are imported as installed (pip install -e .), tools/ and the tests' helpers through pytest's
    `pythonpath` setting: no file reaches into sys.path."""
    offenders = [str(p.relative_to(REPO)) for p in _sources() if re.search(r"sys\.path\.(insert|append|extend)", p.read_text())]
    assert not offenders


# The tests' own folders as pytest puts them on the path (tests/ is in `pythonpath`): `support.*`, `conftest`,
# and the test folders as packages.
TEST_PACKAGES = ("tests", "support", "conftest", "unit", "app", "browser", "live")


def _imports_of_tests(source: str) -> list[str]:
    """The modules of the tests that `source` imports anywhere (a function's own imports too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
        found += [n for n in names if n.split(".")[0] in TEST_PACKAGES]
    return found


def test_the_test_import_finder_finds_them_anywhere():
    source = "import os\ndef f():\n    from tests.support import x\n    import conftest\nfrom tools.hostile import images\n"
    assert _imports_of_tests(source) == ["tests.support", "conftest"]


def test_tools_never_import_tests():
    """The tools run without the tests (what both use, such as the hostile files, lives in tools/)."""
    offenders = {str(p.relative_to(REPO)): found for p in (REPO / "tools").rglob("*.py")
                 if (found := _imports_of_tests(p.read_text()))}
    assert not offenders


# ----------------------------------------------------------------------------------------------
# The import graph of vit_core and dashboard, read from the sources: every import statement anywhere in a module
# (a function's own imports too: they run when called), except those under `if TYPE_CHECKING:`.

PACKAGES = ("vit_core", "dashboard")


def _module_name(path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict:
    """Module name -> path, for every module of the two packages."""
    return {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _is_type_checking_block(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path, modules: dict) -> set:
    """The project modules that module `name` imports: `from pkg import sub` counts as `pkg.sub` where `sub` is a
    module, else as `pkg`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set = set()

    def visit(node) -> None:
        if _is_type_checking_block(node):
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in modules and m != name}


def _import_graph() -> dict:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def connect(v) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def test_the_cycle_finder_finds_a_circle_and_only_circles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"b"}}) == []


def test_the_import_graph_is_read_from_the_sources():
    """The reader sees the edges that matter: a relative import of a sibling, a function's own import."""
    graph = _import_graph()
    assert "vit_core.loading.model" in graph["vit_core.capture"]  # `from .model import ...`
    assert "vit_core.hooks" in graph["vit_core.serving.passes"]  # `from ..hooks import ...`
    assert "vit_core.serving" in graph["dashboard.caches"]  # `from vit_core import ..., serving`: a submodule
    assert "dashboard.models" in graph["dashboard.serve"]  # imported inside serve.main, not at the top


def test_no_import_circles_in_vit_core_or_dashboard():
    assert _cycles(_import_graph()) == []


def test_vit_core_outside_serving_never_imports_serving_or_dashboard():
    """The library's import path stays free of the class server's machinery: only vit_core.serving imports itself."""
    graph = _import_graph()
    offenders = {name: sorted(d for d in deps if d.startswith(("vit_core.serving", "dashboard")))
                 for name, deps in graph.items() if name.startswith("vit_core") and not name.startswith("vit_core.serving")}
    assert {name: deps for name, deps in offenders.items() if deps} == {}


def test_the_server_wing_stands_below_the_pages():
    """dashboard.server (the process's preparation and scheduling, the byte budget, uploads, Streamlit's internals)
    imports nothing of the dashboard outside itself: the pages and their caches come to it, never the other way
    (the server's start, which fills the caches, is dashboard.serve, above them)."""
    graph = _import_graph()
    offenders = {name: sorted(d for d in deps if d.startswith("dashboard") and not d.startswith("dashboard.server"))
                 for name, deps in graph.items() if name.startswith("dashboard.server")}
    assert {name: deps for name, deps in offenders.items() if deps} == {}


def test_a_plain_capture_runs_no_pass_group_lane_or_tracing_code():
    """What a notebook user runs: `load_model`, `run_with_capture`, the export and the explanations in a fresh
    interpreter load no module of vit_core.serving or the dashboard, so none of the class server's pass groups,
    traces or scheduling can run: a plain threading lock, no `between_batches` hook, the judge's lanes at the
    process's own priority with the lock taken once for a run of forwards; and importing vit_core changes nothing in
    the environment."""
    code = (
        "import os, sys, threading\n"
        "before = dict(os.environ)\n"
        "import numpy as np, torch, vit_core\n"
        "from PIL import Image\n"
        "from vit_core import explain\n"
        "from vit_core.explain import passes\n"
        "assert dict(os.environ) == before, 'import vit_core changed the environment'\n"
        "torch.set_num_threads(2)\n"
        "loaded = vit_core.load_model('vit_tiny_patch16_224', pretrained=False, depth=2)\n"
        "assert type(loaded.lock) is type(threading.Lock()), type(loaded.lock)\n"
        "image = Image.fromarray(np.zeros((64, 80, 3), np.uint8))\n"
        "cap = vit_core.run_with_capture(loaded, image)\n"
        "vit_core.export.npz_bytes(vit_core.export.analysis_arrays(loaded, cap))\n"
        "explain.relevance_maps(loaded, cap)\n"
        "rel = explain.relevance_maps(loaded, cap, methods=('rollout', 'raw_attention'))\n"
        "explain.judge(loaded, cap, rel.maps, rel.target, steps=4, tests=('deletion_auc', 'insertion_auc'))\n"
        "seen = set()\n"
        "def forward(i):\n"
        "    seen.add((os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), passes._between_batches.get(),\n"
        "              loaded.lock.locked()))\n"
        "    return i\n"
        "assert explain.forwards_on_lanes(loaded, forward, list(range(8))) == list(range(8))\n"
        "assert seen == {(os.getpriority(os.PRIO_PROCESS, os.getpid()), None, True)}, seen\n"
        "print(sorted(m for m in sys.modules if m.startswith(('vit_core.serving', 'dashboard', 'streamlit'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_public_name_of_vit_core_resolves():
    import vit_core

    assert sorted(vit_core.__all__, key=str.lower) == vit_core.__all__
    for name in vit_core.__all__:
        assert getattr(vit_core, name) is not None, name
