"""The catalog of built-in lenses (vit_core.lenses.catalog): every entry run the same way, on the bundled Shapes ViT:
the same bits twice, its declared keys, its definition in analyses.md, and its twin in the browser's lesson (the
ONNX graph's output by onnxruntime, or web/src/analyses.js by node) where it has one; and what is derived from the
catalog (the export's keys, interface.md's tables, the graph's outputs, the names `--lens` takes)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import drawn_image
from vit_core import export, lenses, load_model, run_with_capture

ROOT = Path(__file__).resolve().parents[2]
CATALOG = [one.name for one in lenses.catalog()]
TOLERANCE = 1e-5  # of the array's largest value (at least 1): the lesson's float32 against the library's


@pytest.fixture(scope="module")
def shapes():
    return load_model("vit-lens/shapes-vit")


@pytest.fixture(scope="module")
def graph_outputs(shapes):
    """The lesson graph's outputs (name -> array of the batch's one image) on drawn_image(5)'s input."""
    ort = pytest.importorskip("onnxruntime")
    from vit_core.web.graph import OUTPUT_NAMES, example_inputs, onnx_graph

    session = ort.InferenceSession(onnx_graph(shapes), providers=["CPUExecutionProvider"])
    cap = run_with_capture(shapes, drawn_image(5))
    _, kept, heads = example_inputs(shapes)
    got = session.run(None, {"pixels": cap.input_tensor[None], "kept": kept.numpy(), "head_mask": heads.numpy()})
    return dict(zip(OUTPUT_NAMES, (out[0] for out in got), strict=True))


def by_name(name: str) -> lenses.Lens:
    (one,) = [one for one in lenses.catalog() if one.name == name]
    return one


def run(one: lenses.Lens, loaded, seed: int = 5) -> dict[str, np.ndarray]:
    """`one`'s own dict on a fresh capture of drawn_image(seed), with the sites it reads."""
    return lenses.results_of(one, run_with_capture(loaded, drawn_image(seed), sites=one.sites), loaded=loaded)


def js_values(expression: str, cap, tmp_path: Path) -> np.ndarray:
    """`expression` evaluated by node over web/src/analyses.js (as A), with `att` the capture's pattern flattened
    (Float32Array) and `g` the geometry as the page's model.js builds it."""
    g = cap.geometry
    geometry = {"L": g.num_layers, "H": g.num_heads, "P": g.num_prefix_tokens, "N": g.num_patches, "T": g.num_tokens,
                "grid": list(g.grid), "patchSize": list(g.patch_size), "hasClassToken": g.has_class_token}
    shutil.copy(ROOT / "web" / "src" / "analyses.js", tmp_path / "analyses.mjs")  # an ES module to node by its suffix
    np.asarray(cap.pattern, dtype="<f4").tofile(tmp_path / "att.f32")
    (tmp_path / "run.mjs").write_text(f"""
import * as A from "./analyses.mjs";
import {{ readFileSync }} from "node:fs";
const bytes = readFileSync(new URL("./att.f32", import.meta.url));
const att = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4), g = {json.dumps(geometry)};
process.stdout.write(JSON.stringify(Array.from({expression})));
""")
    done = subprocess.run(["node", str(tmp_path / "run.mjs")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return np.array(json.loads(done.stdout), dtype=np.float64)


def assert_close(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    ours, theirs = np.asarray(ours, np.float64).ravel(), np.asarray(theirs, np.float64).ravel()
    assert ours.shape == theirs.shape, what
    assert np.abs(ours - theirs).max() <= TOLERANCE * max(1.0, np.abs(ours).max()), what


@pytest.mark.parametrize("name", CATALOG)
def test_every_lens_gives_the_same_bits_twice_its_declared_keys_and_has_its_definition(name, shapes):
    one = by_name(name)
    first, again = run(one, shapes), run(one, shapes)
    assert tuple(first) == one.keys and one.keys, "the keys it declares, in order"
    for key in one.keys:
        assert first[key].tobytes() == again[key].tobytes() and first[key].dtype == again[key].dtype, key
    assert first != {} and run(one, shapes, seed=6)[one.keys[0]].tobytes() != first[one.keys[0]].tobytes()  # the image counts
    headings = [line[3:] for line in (ROOT / "docs/spec/analyses.md").read_text().splitlines() if line.startswith("## ")]
    assert any(h == one.spec or h.startswith(one.spec + " (") for h in headings), f"analyses.md has no ## {one.spec}"


TWINS = [(one.name, key, twin) for one in lenses.catalog() for key, twin in one.browser]


@pytest.mark.parametrize("name, key, twin", TWINS, ids=[f"{n}.{k}" for n, k, _ in TWINS])
def test_the_browsers_twin_gives_the_lenss_numbers(name, key, twin, shapes, graph_outputs, tmp_path):
    one = by_name(name)
    cap = run_with_capture(shapes, drawn_image(5), sites=one.sites)
    ours = lenses.results_of(one, cap, loaded=shapes)[key]
    kind, what = twin.split(":", 1)
    if kind == "graph":
        assert_close(ours, graph_outputs[what], twin)
    else:
        if shutil.which("node") is None:
            pytest.skip("node is not installed: the lesson's JavaScript is compared by the browser tests")
        assert_close(ours, js_values(what, cap, tmp_path), twin)


def test_the_exports_keys_are_the_catalogs_in_order_and_interface_md_lists_each(shapes):
    cap = run_with_capture(shapes, drawn_image(5))
    assert tuple(export.image_arrays(cap)) == lenses.export_keys() != ()
    assert tuple(export.analysis_arrays(shapes, cap))[:len(lenses.export_keys())] == lenses.export_keys()
    interface = (ROOT / "docs/spec/interface.md").read_text()
    analyze_table = interface.split("## Command line", 1)[1].split("\n## ", 1)[0]
    explain_table = interface.split("## Explanations in the export", 1)[1].split("\n## ", 1)[0]
    for key in lenses.export_keys():
        assert f"| `{key}` |" in analyze_table, key
    for key in lenses.export_keys("explain"):
        assert f"| `{key}` |" in explain_table, key
    listed = re.findall(r"^\| `(\w+)` \|", analyze_table, re.M)
    assert [k for k in listed if k in lenses.export_keys()] == list(lenses.export_keys())  # the table's order too


def test_what_the_dashboard_holds_gives_the_same_export_as_computing_it(shapes):
    cap = run_with_capture(shapes, drawn_image(5))
    held = {name: lenses.results_of(by_name(name), cap) for name in ("mean_attention_distance", "rollout")}
    given = export.image_arrays(cap, computed=held)
    mad = held["mean_attention_distance"]
    old_way = export.image_arrays(cap, (mad["mean_attention_distance"], mad["mean_attention_distance_renorm"]),
                                  held["rollout"]["rollout"])
    for key, value in export.image_arrays(cap).items():
        assert value.tobytes() == given[key].tobytes() == old_way[key].tobytes(), key


def test_the_graphs_outputs_and_the_lens_names_come_from_the_catalog():
    pytest.importorskip("onnx")
    from vit_core.__main__ import BUILTIN_LENSES
    from vit_core.web.graph import OUTPUT_NAMES

    assert OUTPUT_NAMES == lenses.graph_outputs() == ("logits", "attention", "logit_lens", "token_norms")
    assert set(BUILTIN_LENSES) == {one.name for one in lenses.catalog() if not one.export}
    assert lenses.export_keys("explain") == ("logit_lens", "token_norms")


def test_a_lens_that_reads_the_model_says_so_without_it_and_a_lens_with_other_keys_fails(shapes, tmp_path):
    cap = run_with_capture(shapes, drawn_image(5))
    with pytest.raises(lenses.LensError, match=r"^lens 'logit_lens' reads the model's weights as well as the capture"):
        lenses.results_of(by_name("logit_lens"), cap)
    path = tmp_path / "keyed.py"
    path.write_text("from vit_core.lenses import lens\n@lens('keyed', keys=('a', 'b'))\ndef f(cap):\n"
                    "    return {'b': cap.logits, 'a': cap.logits}\n")
    (keyed,) = lenses.lenses_of([str(path)])
    with pytest.raises(lenses.LensError, match=r"returned the keys \['b', 'a'\], not its declared \['a', 'b'\]"):
        lenses.arrays_of(keyed, cap)
