"""`vit-lens export-web`: the folder a static host serves, whose model runs in each student's browser.

    DIR/index.html, style.css, src/*.js   the page (plain ES modules), copied from the checkout's web/
    DIR/lesson.json                        the lesson's step titles and concept check (web/lesson.json)
    DIR/model.onnx, model-logits.onnx      the graphs (vit_core.web.graph): every output, and the logits alone for the
                                           perturbation tests; checked by onnxruntime against the library
    DIR/model.weights                      their weights, one file both graphs read (each tensor once)
    DIR/model.json                         geometry, preprocessing, labels, examples, the deletion test's random orders
    DIR/figures.json                       the figures that depend on the weights only: filters, their principal
                                           components, the position embeddings' similarity (float32, base64)
    DIR/examples/*.png                     the examples
    DIR/ort/                               ONNX Runtime Web's own files from its npm package, its licence beside them
    DIR/.vit-lens-lesson                   written last: the mark that lets a later export replace this folder

Nothing in the folder refers to another origin: served from anywhere, it fetches only its own files.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from .. import analyses
from ..capture import run_with_capture
from ..explain.perturbation import DEFAULT_STEPS, RANDOM_ORDERS, random_patch_orders
from ..loading.model import LoadedModel, patch_embed_weight, pos_embed_rows
from ..teaching.data import CLASS_NAMES, sample_image
from ..teaching.model import TEACHING_MODEL
from .graph import INPUT_NAMES, OUTPUT_NAMES, WebExportError, onnx_graph, shared_weights
from .target import WEB_ROOT, target_refused, written_then_swapped

_logger = logging.getLogger(__name__)

ORT_PACKAGE = "onnxruntime-web"
# The WASM (CPU) build only: its loader module, its worker-capable glue and its binary (about 14 MB). WebGPU and
# WebGL builds stay out: a lesson's model is small, and one backend behaves the same on every student's machine.
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
ORT_LICENCE = "LICENSE-onnxruntime-web.txt"  # web/licences/: the package ships none; its files say "MIT", this is it
PAGE_FILES = ("index.html", "style.css", "lesson.json")
EXAMPLE_SEED = 2  # the dashboard's shape examples (dashboard.examples.SHAPE_EXAMPLE_SEED): the same drawings
PARITY_TOLERANCE = 1e-4  # the written graphs' logits against the library's, on the first example
GRAPH, LOGITS_GRAPH, WEIGHTS = "model.onnx", "model-logits.onnx", "model.weights"


def ort_dist(web_root: Path = WEB_ROOT) -> Path:
    """onnxruntime-web's dist/ folder as npm installed it; WebExportError saying how to install it if it is not there."""
    dist = web_root / "node_modules" / ORT_PACKAGE / "dist"
    missing = [name for name in ORT_FILES if not (dist / name).is_file()]
    if not (web_root / "index.html").is_file():
        raise WebExportError(f"The page's files are not here ({web_root}): export-web runs from a checkout of ViT Lens.")
    if missing:
        raise WebExportError(f"ONNX Runtime Web is not installed ({dist / missing[0]} is missing): run "
                             f"`bash tools/setup` or `npm ci --prefix {web_root}`.")
    return dist


def ort_version(web_root: Path = WEB_ROOT) -> str:
    return json.loads((web_root / "node_modules" / ORT_PACKAGE / "package.json").read_text())["version"]


def encoded(array: np.ndarray) -> dict[str, Any]:
    """A float32 array for the page: {"shape": [...], "data": base64 of its little-endian bytes, row-major}."""
    array = np.ascontiguousarray(array, dtype="<f4")
    return {"shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode("ascii")}


def weight_figures(loaded: LoadedModel) -> dict[str, Any]:
    """The figures that depend on the weights only (analyses.md, "Embedding filters", "Position-embedding
    similarity"): filters (D, ph, pw, 3), their principal components (k, ph, pw, 3) with their explained-variance
    ratio (k,), and the position embeddings' similarity (N, gh, gw) where the model has a learned one."""
    g = loaded.geometry
    weight = patch_embed_weight(loaded)  # (D, 3, ph, pw)
    pca = analyses.filters_pca(weight)
    figures = {
        "filters": encoded(analyses.filter_images(weight)),
        "filters_pca": encoded(pca.components),
        "filters_pca_explained": encoded(pca.explained_variance_ratio),
    }
    rows = pos_embed_rows(loaded)
    if rows is not None and g.has_pos_embed:
        figures["pos_embed_similarity"] = encoded(
            analyses.pos_embed_similarity(rows, g.num_prefix_tokens, g.no_embed_class, g.grid))
    return figures


def example_images(loaded: LoadedModel) -> dict[str, Image.Image]:
    """file name -> image: the eight shapes the dashboard shows (the teaching model's classes), drawn at the
    teaching model's size; another model also gets matplotlib's public-domain photo of Grace Hopper."""
    examples = {f"{name}.png": sample_image(name, seed=EXAMPLE_SEED) for name in CLASS_NAMES if name != "other"}
    if loaded.name != TEACHING_MODEL:
        import matplotlib.cbook

        with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
            examples = {"grace_hopper.png": Image.open(io.BytesIO(f.read())).convert("RGB"), **examples}
    return examples


def model_description(loaded: LoadedModel, examples: list[str], steps: int = DEFAULT_STEPS) -> dict[str, Any]:
    """model.json: everything the page needs besides the graph and the figures."""
    g, config = loaded.geometry, loaded.data_config
    return {
        "name": loaded.name,
        "weights": loaded.weights,
        "labels": [loaded.label(i) for i in range(g.num_classes)],
        "geometry": {
            "img_size": list(g.img_size), "patch_size": list(g.patch_size), "grid": list(g.grid),
            "prefix_names": list(g.prefix_names), "num_layers": g.num_layers, "num_heads": g.num_heads,
            "embed_dim": g.embed_dim, "num_classes": g.num_classes,
        },
        "preprocessing": {  # timm's eval transform (vit_core.loading.model.resized_size says how the page resizes)
            "input_size": list(config["input_size"]), "mean": list(config["mean"]), "std": list(config["std"]),
            "crop_pct": config.get("crop_pct") or 0.875, "interpolation": config.get("interpolation", "bilinear"),
            "crop_mode": config.get("crop_mode") or "center",
        },
        "graph": {"file": GRAPH, "logits_file": LOGITS_GRAPH, "weights": WEIGHTS, "inputs": list(INPUT_NAMES),
                  "outputs": list(OUTPUT_NAMES)},
        "examples": examples,
        # The deletion test's random baseline: numpy's seeded orders (analyses.md), which a browser can't draw itself.
        "deletion": {"steps": steps, "seed": 0, "random_orders": random_patch_orders(g.num_patches, RANDOM_ORDERS, 0).tolist()},
        "ort_version": ort_version(),
    }


def graph_files(loaded: LoadedModel) -> dict[str, bytes]:
    """The two graphs and their shared weights file, by file name."""
    graphs, weights = shared_weights({GRAPH: onnx_graph(loaded), LOGITS_GRAPH: onnx_graph(loaded, logits_only=True)}, WEIGHTS)
    return {**graphs, WEIGHTS: weights}


def check_graphs(loaded: LoadedModel, folder: Path, example: Image.Image) -> None:
    """Both written graphs give the library's logits on `example` (onnxruntime, from `folder`); WebExportError if not."""
    try:
        import onnxruntime
    except ImportError as error:
        raise WebExportError('export-web needs onnxruntime to check the graph: pip install "vit-lens[web]".') from error
    cap = run_with_capture(loaded, example)
    g = loaded.geometry
    feeds = {"pixels": cap.input_tensor[None], "kept": np.arange(g.num_patches)[None],
             "head_mask": np.ones((g.num_layers, g.num_heads), np.float32)}
    for name in (GRAPH, LOGITS_GRAPH):
        session = onnxruntime.InferenceSession(str(folder / name), providers=["CPUExecutionProvider"])
        difference = float(np.abs(session.run(["logits"], feeds)[0][0] - cap.logits).max())
        if difference > PARITY_TOLERANCE * max(1.0, float(np.abs(cap.logits).max())):
            raise WebExportError(f"{loaded.name}'s ONNX graph {name} gives logits {difference:.2g} away from the library's.")
        _logger.info("%s checked on an example: logits within %.2g of the library's", name, difference)


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_site(loaded: LoadedModel, out: str | Path, web_root: Path = WEB_ROOT) -> dict[str, int]:
    """Write the static lesson for `loaded` into `out`: a new folder, an empty one, or one a previous export wrote
    (vit_core.web.target: written beside it and swapped in whole, the old lesson kept on any failure). Returns each
    written file's size in bytes, by its path relative to `out`. Raises WebExportError (one sentence) for a folder it
    may not replace, a model the graph can't carry, or a checkout without the page's files or ONNX Runtime Web."""
    out = Path(out)
    why = target_refused(out, web_root)
    if why:
        raise WebExportError(f"{out}: {why}")
    dist = ort_dist(web_root)
    examples = example_images(loaded)
    graphs = graph_files(loaded)  # before anything is written: a model the graph can't carry is refused first
    written_then_swapped(out, lambda folder: _write_files(loaded, folder, web_root, dist, examples, graphs))
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}


def _write_files(loaded: LoadedModel, out: Path, web_root: Path, dist: Path, examples: dict[str, Image.Image],
                 graphs: dict[str, bytes]) -> None:
    """Every file of the site into the new folder `out`."""
    (out / "examples").mkdir()
    (out / "ort").mkdir()
    shutil.copytree(web_root / "src", out / "src")
    for name in PAGE_FILES:
        shutil.copyfile(web_root / name, out / name)
    for name in ORT_FILES:
        shutil.copyfile(dist / name, out / "ort" / name)
    shutil.copyfile(web_root / "licences" / ORT_LICENCE, out / "ort" / ORT_LICENCE)
    for name, data in graphs.items():
        (out / name).write_bytes(data)
    check_graphs(loaded, out, next(iter(examples.values())))
    for name, image in examples.items():
        (out / "examples" / name).write_bytes(png(image))
    (out / "model.json").write_text(json.dumps(model_description(loaded, [f"examples/{n}" for n in examples])))
    (out / "figures.json").write_text(json.dumps(weight_figures(loaded)))
