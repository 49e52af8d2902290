"""The core stays usable without the UI: nothing in vit_core imports streamlit."""

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
