"""The same run on Ray Data: decoding in a CPU stage, the model's reductions in a pool of stateful workers, each
shard's totals added up and written by the driver, exactly as `runs.run_shards` writes them.

    files (driver) -> DecodeStage (CPU actors: file -> the model's crop, uint8) -> ReduceStage (one model per
    worker, on its GPU or CPU: crops -> per-image values, as reduce_batch) -> driver: per shard, sorted by image,
    added up (Totals) and written as the shard's part

Each worker rebuilds the model from a `ModelSpec` (a name, a weights path, keyword arguments), never from a
pickled module, once. A worker that dies is restarted by Ray and its batch retried (Ray Data's actor pools
restart without limit); only a finished batch's rows reach the driver, and the driver checks that every image
of a shard came back exactly once before writing it. Ray is an optional dependency (`pip install "vit-lens[ray]"`):
this module imports it only inside its functions.

On a cluster FOLDER and --weights must be at the same path on every node (a shared file system), and every node
needs ViT Lens installed with the same versions.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, TextIO

import numpy as np

from ..errors import ViTLensError
from ..export import EXPORT_TESTS
from ..lenses import Lens, LensError, lenses_of
from ..loading import load_model
from ..loading.model import Geometry, LoadedModel
from ..runtime import cpu_quota
from ..runtime.devices import describe_device
from .analyze import Masks, Progress, add_lensed_image, explained_values
from .listing import Shard
from .reductions import BatchValues, LensedImage, decoded_crop, patch_distances_on, reduce_batch
from .runs import PartStore, RunPlan, shard_start
from .totals import Totals

_logger = logging.getLogger(__name__)

INSTALL = 'pip install "vit-lens[ray]"'


class RayMissingError(ViTLensError, ImportError):
    """--engine ray without Ray installed."""


class RayRunError(ViTLensError, RuntimeError):
    """Ray could not run the analysis (no cluster at the address, no GPU for the workers asked, ...): one sentence."""


def import_ray() -> Any:
    """The `ray` module with Ray Data, or RayMissingError saying how to get it."""
    try:
        import ray
        import ray.data  # Ray Data is the `data` extra of ray
    except ImportError as e:
        raise RayMissingError(f"The Ray engine needs Ray Data, which is not installed ({e}): {INSTALL}") from None
    return ray


@dataclass(frozen=True)
class ModelSpec:
    """How a worker builds the model: `vit_core.load_model`'s arguments (a path, not the weights themselves)."""

    name: str
    weights: str | None = None  # a weights file every node can read at this path
    pretrained: bool = True
    labels: str | None = None  # a label file, likewise
    seed: int = 0
    kwargs: dict[str, Any] = field(default_factory=dict)  # timm.create_model's, e.g. depth=2 for a test model

    def load(self, device: str = "auto") -> LoadedModel:
        return load_model(self.name, weights=self.weights, pretrained=self.pretrained, labels=self.labels, seed=self.seed,
                          device=device, **self.kwargs)


# ----------------------------------------------------------------------------------------------
# The two stages (Ray actors: constructed once per worker, then called on each batch)


class DecodeStage:
    """CPU stage: a batch's files -> the model's crops, uint8 (B, H, W, 3) (zeros where a file failed), and the
    reason per file ("" when it was read). The crop is what DecodedImages would normalise; a crop travels as a
    quarter of its float32 input's bytes."""

    def __init__(self, crop_transform: Any, min_side: int, input_size: tuple[int, int]) -> None:
        self.crop_transform, self.min_side, self.input_size = crop_transform, min_side, tuple(input_size)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        crops = np.zeros((len(batch["path"]), *self.input_size, 3), dtype=np.uint8)  # (B, H, W, 3)
        errors = []
        for row, path in enumerate(batch["path"]):
            crop = decoded_crop(Path(str(path)), self.crop_transform, self.min_side)
            errors.append(crop if isinstance(crop, str) else "")
            if not isinstance(crop, str):
                crops[row] = np.asarray(crop, dtype=np.uint8)  # PIL RGB (H, W) -> (H, W, 3)
        return {"index": batch["index"], "path": batch["path"], "crop": crops, "error": np.array(errors, dtype=object)}


def lens_sources(lenses: Sequence[Lens]) -> tuple[tuple[str, str], ...]:
    """What a model worker loads its lenses from: each lens's file (its absolute path: a worker's directory is not
    this one's) or module, and the file's SHA-256 that the worker's copy must have."""
    sources = {}
    for one in lenses:
        source = str(Path(one.source).resolve()) if Path(one.source).is_file() else one.source
        sources[source] = one.sha256
    return tuple(sources.items())


def worker_lenses(sources: Sequence[tuple[str, str]]) -> list[Lens]:
    """The lenses of `sources` (`lens_sources`) loaded in a model worker. Raises LensError when a file there is not
    the one the run started with (its SHA-256 differs: another copy on another node)."""
    lenses = lenses_of([source for source, _ in sources])
    expected = dict(sources)
    for one in lenses:
        if expected.get(one.source, one.sha256) != one.sha256:
            raise LensError(f"--lens {one.source}: this worker's copy differs from the file the run started with "
                            "(its SHA-256); give every node the same file.")
    return lenses


def lensed_bytes(lensed: LensedImage) -> bytes:
    """One image's lens arrays as .npz bytes: how they travel from a model worker to the driver."""
    buffer = io.BytesIO()
    np.savez(buffer, **lensed.arrays)
    return buffer.getvalue()


def lensed_of_bytes(data: bytes, failed: str) -> LensedImage:
    """`lensed_bytes` and the JSON list of the lenses' failures back to the image's LensedImage."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {key: npz[key] for key in npz.files}
    return LensedImage(arrays, tuple(json.loads(failed)))


def worker_device(threads: int | None = None) -> str:
    """Where a model worker builds its model: "auto" (the GPU Ray gave it), else "cpu" with `threads` torch threads
    (default: this node's CPU quota): Ray limits a worker's threads to its CPUs; the forward takes what the quota gives."""
    import torch

    if os.environ.get("CUDA_VISIBLE_DEVICES") and torch.cuda.is_available():
        return "auto"
    torch.set_num_threads(threads or cpu_quota())
    return "cpu"


def value_columns(geometry: Geometry, count: int, rows: Sequence[int], values: BatchValues | None) -> dict[str, np.ndarray]:
    """A batch's reduced values as the model stage's columns (what `shard_totals` adds up): row r of each is image r's,
    where `rows` are the batch rows that `values` (one row per image, in that order) are of; elsewhere (an image that
    failed) -1 for a class and zeros."""
    g = geometry
    out = {
        "top1": np.full(count, -1, dtype=np.int64), "probability": np.zeros(count, dtype=np.float32),
        "distance": np.zeros((count, g.num_layers, g.num_heads), dtype=np.float32),
        "distance_renorm": np.zeros((count, g.num_layers, g.num_heads), dtype=np.float32),
        "high_norm_rate": np.zeros((count, g.num_layers + 1), dtype=np.float32),
        "lens_top1": np.full((count, g.num_layers + 1), -1, dtype=np.int64),
    }
    if values is None or not len(rows):
        return out
    rows = list(rows)
    for name in ("top1", "probability", "distance", "distance_renorm", "high_norm_rate"):
        out[name][rows] = getattr(values, name)
    if values.lens_top1 is not None:
        out["lens_top1"][rows] = values.lens_top1
    return out


class ReduceStage:
    """Model stage: the model built once per worker (on the GPU Ray gave it, else the CPU); per batch one hooked
    forward reduced on the device (reduce_batch), with `lenses` their arrays read on the same forward, and with
    `explain` each image's `explained_values`."""

    def __init__(self, spec: ModelSpec, logit_lens: bool, explain: bool, steps: int, threads: int | None = None,
                 tests: Sequence[str] = EXPORT_TESTS, masks: Masks | None = None,
                 lenses: Sequence[tuple[str, str]] = ()) -> None:
        self.loaded = spec.load(worker_device(threads))
        self.device = describe_device(self.loaded.device)
        self.distance = patch_distances_on(self.loaded.geometry, self.loaded.device)
        self.logit_lens, self.explain, self.steps, self.tests, self.masks = logit_lens, explain, steps, tuple(tests), masks
        self.lenses = worker_lenses(lenses) if lenses else []

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch
        from PIL import Image

        count = len(batch["index"])
        errors = [str(e) for e in batch["error"]]
        good = [row for row in range(count) if not errors[row]]
        explained = [""] * count  # JSON of each image's named scalars ("" without)
        explain_errors = [""] * count  # why an image has no explanation ("" when it has one, or none was asked)
        lensed, lens_failed = [b""] * count, ["[]"] * count  # each image's lens arrays (lensed_bytes), failures (JSON)
        values = None
        if good:
            x = torch.stack([self.loaded.tensor_transform(Image.fromarray(batch["crop"][row])) for row in good])  # (B', 3, H, W)
            values = reduce_batch(self.loaded, x, self.logit_lens, self.distance, lenses=self.lenses,
                                  crops=batch["crop"][good] if self.lenses else None)
            for row, one in zip(good, values.lensed or (), strict=False):
                lensed[row], lens_failed[row] = lensed_bytes(one), json.dumps(list(one.failed))
        out = {"index": batch["index"], **value_columns(self.loaded.geometry, count, good, values)}
        for row in good if self.explain else ():
            try:  # decoded again: it needs gradients, one image at a time
                path = Path(str(batch["path"][row]))
                mask = None if self.masks is None else self.masks.mask_for((str(path), path))
                explained[row] = json.dumps(explained_values(self.loaded, path, self.steps, tests=self.tests, mask=mask))
            except ViTLensError as e:
                explain_errors[row] = f"No explanation: {e}"
        out["error"] = np.array(errors, dtype=object)
        out["explained"] = np.array(explained, dtype=object)
        out["explain_error"] = np.array(explain_errors, dtype=object)
        if self.lenses:
            out["lensed"], out["lens_failed"] = np.array(lensed, dtype=object), np.array(lens_failed, dtype=object)
        out["device"] = np.array([self.device] * count, dtype=object)
        return out


# ----------------------------------------------------------------------------------------------
# The driver


@contextlib.contextmanager
def workers_at_this_niceness() -> Iterator[None]:
    """Inside the block, a Ray started on this machine runs its workers at this process's niceness. Ray's default
    (15) is for a cluster's background tasks: beside any other work (two busy processes, a browser) its workers get a
    few percent of a core and a run on this machine crawls; Ray's own job manager starts its jobs at 0 the same way
    (the raylet reads `RAY_worker_niceness` when it starts)."""
    key = "RAY_worker_niceness"
    before = os.environ.get(key)
    os.environ[key] = str(os.getpriority(os.PRIO_PROCESS, 0)) if hasattr(os, "getpriority") else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """Ray connected for the block: the cluster at `address` (e.g. "ray://head:10001" or "auto"), else a Ray
    started on this machine with `num_cpus` (default: this process's CPU quota), no dashboard, shut down after.
    A Ray started here runs its workers at this process's niceness (`workers_at_this_niceness`). A Ray already
    initialised in this process (a notebook's, a test's) is used as it is and left running."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    quiet = {"include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": False,
             "configure_logging": False}
    try:
        if address:
            ray.init(address=address, **quiet)
        else:
            with workers_at_this_niceness():
                ray.init(num_cpus=num_cpus or cpu_quota(), **quiet)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayRunError(f"Ray could not start{f' at {address}' if address else ''}: {e}") from None
    _quiet_ray_data_console()
    try:
        yield ray
    finally:
        ray.shutdown()


@contextlib.contextmanager
def ray_output_to(log: Path) -> Iterator[TextIO]:
    """What Ray prints in this process appended to `log` for the block, which holds a `ray_session`, not mixed with
    the command's own lines: its loggers' lines (at start-up "Token authentication is enabled ..."), its C++ core's,
    which runs in this process and writes its errors to file descriptor 2 ("core_worker.cc: ... the actor restart
    will fail", about Ray Data's own actors), and the raylet's task errors, which its listener prints on sys.stdout
    ("(raylet) Task ... failed ... will be retried", when a worker dies or a run is stopped). So descriptor 2 and
    sys.stdout are the log for the block; what the command writes meanwhile goes to streams it took before (its
    progress lines) or to the one yielded (its progress bar): sys.stderr where that is not descriptor 2 (a test's
    capture, a notebook's), else a stream on the descriptor's former file (the terminal)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    terminal = os.dup(2)
    stdout = sys.stdout
    try:
        with open(log, "ab") as file:
            os.dup2(file.fileno(), 2)
        console = os.fdopen(os.dup(terminal), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
                            errors="backslashreplace")
        with console, open(log, "a", buffering=1, encoding="utf-8", errors="backslashreplace") as printed:
            sys.stdout = printed
            yield console if _writes_to_descriptor_2(sys.stderr) else sys.stderr
    finally:
        sys.stdout = stdout
        sys.stderr.flush()  # what Ray's loggers left in its buffer belongs in the log too
        os.dup2(terminal, 2)
        os.close(terminal)


def _writes_to_descriptor_2(stream: Any) -> bool:
    try:
        return stream.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a test's capture, a StringIO: no descriptor of its own
        return False


def _quiet_ray_data_console() -> None:
    """Ray Data's console lines at ERROR only: its INFO and WARNING lines (each run's plan and timing, "progress bars
    disabled") would mix with this command's own progress and one-line failures. Its session log file keeps them,
    and `ray_plan` refuses the worker counts that would make it wait for resources the cluster lacks."""
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.setLevel(max(handler.level, logging.ERROR))


@dataclass(frozen=True)
class RayPlan:
    """How many workers of each kind, from the cluster's resources unless given."""

    model_workers: int
    gpus_per_worker: float
    decoders: int


def ray_plan(ray: Any, model_workers: int | None = None, gpus_per_worker: float | None = None,
             decoders: int | None = None) -> RayPlan:
    """Defaults: a GPU per model worker when the cluster has GPUs (none otherwise), as many model workers as the
    GPUs allow (1 on CPUs), and every CPU the model workers leave (1 each) for decoding, at least 1."""
    resources = ray.cluster_resources()
    gpus, cpus = float(resources.get("GPU", 0)), int(resources.get("CPU", 1))
    gpus_per_worker = (1.0 if gpus else 0.0) if gpus_per_worker is None else gpus_per_worker
    model_workers = model_workers or (max(1, int(gpus // gpus_per_worker)) if gpus_per_worker else 1)
    if model_workers * gpus_per_worker > gpus:  # Ray would wait for GPUs that never come
        raise RayRunError(f"{model_workers} model workers of {gpus_per_worker:g} GPUs each, but the Ray cluster has "
                          f"{gpus:g} GPUs.")
    if model_workers + 1 > cpus:
        raise RayRunError(f"{model_workers} model workers and a decoding one need {model_workers + 1} CPUs, but the Ray "
                          f"cluster has {cpus}.")
    decoders = decoders or max(1, cpus - model_workers)
    if model_workers + decoders > cpus:
        raise RayRunError(f"{model_workers} model workers and {decoders} decoding ones need {model_workers + decoders} "
                          f"CPUs (one each), but the Ray cluster has {cpus}.")
    return RayPlan(model_workers, gpus_per_worker, decoders)


def decoded_crops(ray, loaded: LoadedModel, plan: RunPlan, todo: Sequence[Shard], batch_size: int, workers: RayPlan):
    """The images of the shards `todo` of `plan` as a Ray dataset of model-ready crops, decoded on `workers.decoders`
    actors (DecodeStage): rows {"index", "crop", ...} in batches of `batch_size`."""
    items = [{"index": i, "path": os.path.abspath(plan.paths[i])} for shard in todo for i in range(shard.start, shard.stop)]
    return ray.data.from_items(items).map_batches(
        DecodeStage, fn_constructor_kwargs={"crop_transform": loaded.crop_transform, "min_side": loaded.decode_min_side,
                                            "input_size": tuple(loaded.data_config["input_size"][1:])},
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=workers.decoders), num_cpus=1)


def run_shards_on_ray(spec: ModelSpec, loaded: LoadedModel, plan: RunPlan, store: PartStore, todo: Sequence[Shard],
                      files_sha256: str, *, workers: RayPlan, batch_size: int, explain: bool = False, steps: int = 10,
                      tests: Sequence[str] = EXPORT_TESTS, masks: Masks | None = None,
                      threads: int | None = None, progress: Progress | None = None,
                      reducer: type[ReduceStage] = ReduceStage, lenses: Sequence[Lens] = ()) -> None:
    """`runs.run_shards` on the Ray cluster this process is connected to (`ray_session`): the shards `todo` of `plan`,
    each one's part written by this process as soon as all its images are back. `loaded`: the model on this
    machine, for its transforms (the workers build their own from `spec`). `reducer`: the model stage's class.
    `lenses`: each worker loads them from their files or modules (`lens_sources`), read on the same forward."""
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # this command reports progress itself
    logit_lens = plan.labels is not None
    for shard in todo:
        if shard.size == 0:
            store.write(shard, shard_start(plan, shard), describe_device(loaded.device), files_sha256)
    todo = [shard for shard in todo if shard.size]
    if not todo:
        return
    crops = decoded_crops(ray, loaded, plan, todo, batch_size, workers)
    values = crops.map_batches(
        reducer, fn_constructor_kwargs={"spec": spec, "logit_lens": logit_lens, "explain": explain, "steps": steps,
                                        "threads": threads, "tests": tuple(tests), "masks": masks,
                                        "lenses": lens_sources(lenses)},
        batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=workers.model_workers), num_cpus=1,
        num_gpus=workers.gpus_per_worker or None)

    for shard, pieces in finished_shards(values, todo, progress):
        totals, device = shard_totals(plan, shard, pieces, logit_lens)
        store.write(shard, totals, device, files_sha256)


def finished_shards(values: Any, todo: Sequence[Shard], progress: Progress | None = None
                    ) -> Iterator[tuple[Shard, list[dict[str, np.ndarray]]]]:
    """The model stage's rows (`values`: a Ray dataset with an "index" column) of the shards `todo`, gathered per shard:
    each shard with its pieces (its rows of each batch, in the order Ray returned them) as soon as all its images are
    back. Raises RayRunError when Ray fails, or returns fewer images than a shard holds."""
    import ray

    starts = np.array([shard.start for shard in todo])
    received: dict[int, list[dict[str, np.ndarray]]] = {shard.number: [] for shard in todo}
    count = {shard.number: 0 for shard in todo}
    by_number = {shard.number: shard for shard in todo}
    total, done = sum(shard.size for shard in todo), 0
    try:
        for batch in values.iter_batches(batch_size=None, batch_format="numpy"):
            owners = np.array([todo[k].number for k in np.searchsorted(starts, batch["index"], side="right") - 1])
            for number in np.unique(owners):
                rows = owners == number
                received[number].append({key: value[rows] for key, value in batch.items()})
                count[number] += int(rows.sum())
                if count[number] == by_number[number].size:
                    yield by_number[number], received.pop(number)
            done += len(batch["index"])
            if progress:
                progress(done, total)
    except ray.exceptions.RayError as e:
        raise RayRunError(f"Ray could not finish the analysis: {str(e).splitlines()[0]}") from None
    unfinished = sorted(received)  # a shard leaves `received` when it is yielded
    if unfinished:
        raise RayRunError(f"Ray returned {sum(count[n] for n in unfinished)} images for shards {unfinished} "
                          "that hold more; run the command again to finish them.")


def shard_totals(plan: RunPlan, shard: Shard, pieces: list[dict[str, np.ndarray]], logit_lens: bool) -> tuple[Totals, str]:
    """A shard's totals from the model stage's rows (in any order, as Ray returns them): sorted by image, each image
    checked to be there exactly once, then added up as `run_shards` adds them. Returns the totals and the devices."""
    rows = {key: np.concatenate([piece[key] for piece in pieces]) for key in pieces[0]}
    order = np.argsort(rows["index"], kind="stable")
    rows = {key: value[order] for key, value in rows.items()}
    if not np.array_equal(rows["index"], np.arange(shard.start, shard.stop)):
        raise RayRunError(f"Ray returned the images of {shard.name} other than once each; run the command again.")
    names = plan.names
    totals = shard_start(plan, shard)
    good = np.array([not error for error in rows["error"]], dtype=bool)
    explained = [json.loads(text) if text else {} for text in rows["explained"]]
    for index, error, explain_error in zip(rows["index"], rows["error"], rows["explain_error"], strict=True):
        if error or explain_error:
            totals.failures.append((names[index], str(error or explain_error)))
    if good.any():
        values = BatchValues(distance=rows["distance"][good], distance_renorm=rows["distance_renorm"][good],
                             high_norm_rate=rows["high_norm_rate"][good], top1=rows["top1"][good],
                             probability=rows["probability"][good],
                             lens_top1=rows["lens_top1"][good] if logit_lens else None)
        indices = rows["index"][good]
        totals.add_batch([names[i] for i in indices], [plan.labels[i] for i in indices] if logit_lens else None, values,
                         [explained[k] for k in np.flatnonzero(good)] if any(explained) else None)
        for k in np.flatnonzero(good) if "lensed" in rows else ():  # in image order, as run_shards adds them
            add_lensed_image(totals, names[rows["index"][k]], lensed_of_bytes(rows["lensed"][k], rows["lens_failed"][k]))
    devices = ", ".join(dict.fromkeys(str(d) for d in rows["device"]))
    return totals, devices
