"""Layout rules: the core stays usable without the UI (no streamlit, no dashboard import in vit_core), and
nothing edits sys.path (everything is imported as installed)."""

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
    """The packages are imported as installed (pip install -e .), the scripts' helpers through pytest's
    `pythonpath` setting: no file reaches into sys.path."""
    offenders = [str(p.relative_to(REPO)) for p in _sources() if re.search(r"sys\.path\.(insert|append|extend)", p.read_text())]
    assert not offenders
