"""What every explanation pass shares: the target class, the model's input, and a pass of the shared model.

Each entry point of `vit_core.explain` takes `loaded.lock` around every forward (a capture on another thread
registers hooks on the same modules, which a concurrent forward would fire), runs in eval mode and in ViT
Lens's float32 (`devices.full_float32`), and hands the model inputs made on its device. A caller that shares the
model among many users (the class server) reaches the long runs of forwards through one hook, `between_batches`.
"""

from __future__ import annotations

import contextlib
import contextvars
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from PIL import Image

from ..arguments import target_message
from ..capture import Capture, preprocess
from ..errors import ViTLensError
from ..hooks import eval_mode
from ..loading.model import LoadedModel
from ..runtime import torch_threads
from ..runtime.devices import full_float32, on_model_device

Item, Result = TypeVar("Item"), TypeVar("Result")

# Forwards of one model at once, at most: each lane holds a batch's activations (ViT-B/16's MLP hidden layer alone,
# for 16 inputs: 16 x 197 x 3072 float32, 39 MB).
MAX_LANES = 4


class TargetError(ViTLensError, ValueError):
    """A target class that the model does not have (index out of range, unknown label)."""


class InterventionError(ViTLensError, ValueError):
    """An intervention the model can't run: a patch or head it does not have, an unknown ablation, or
    every patch dropped from a model that pools its patch tokens (no class token)."""


# ----------------------------------------------------------------------------------------------
# The one hook for a caller that shares the model


_between_batches: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "vit_lens_between_batches", default=None)


@contextlib.contextmanager
def between_batches(hook: Callable[[], None]) -> Iterator[None]:
    """Inside the block, this context's long runs of forwards (`forwards_on_lanes`: the judge, the sanity checks; a
    concept set's images) call `hook()` before each batch, with the model's lock not held, and `forwards_on_lanes`
    takes the lock one batch (one item per lane) at a time instead of once for the run. A caller sharing the model
    lets other forwards in there, or ends the run by raising from the hook. Outside any such block nothing is
    called. What a forward computes never depends on it: the batches are the same either way."""
    token = _between_batches.set(hook)
    try:
        yield
    finally:
        _between_batches.reset(token)


def batch_boundary() -> None:
    """Called by a long run of forwards between two of them, without the model's lock: this context's
    `between_batches` hook, if any."""
    hook = _between_batches.get()
    if hook is not None:
        hook()


# ----------------------------------------------------------------------------------------------
# Target class


def resolve_target(loaded: LoadedModel, logits: np.ndarray, target: int | str | None = None) -> int:
    """The target class c: None -> top-1 of `logits` (C,) (ties: the lower index, as `analyses.top_k`);
    an int -> that class index; a string -> the class whose label (or its first comma-separated part)
    equals it, case-insensitive, or a decimal index. Raises TargetError (a ValueError) with a message for the user."""
    num_classes = int(logits.shape[-1])
    if target is None:
        return int(np.argmax(logits))  # argmax returns the first maximum: the lower index wins ties
    if isinstance(target, str):
        wanted = target.strip().lower()
        if wanted.isascii() and wanted.isdigit():  # str.isdigit() alone accepts '²', which int() refuses
            if len(wanted.lstrip("0")) > len(str(num_classes)):  # int() refuses over 4,300 digits: out of range anyway
                raise TargetError(f"class index {wanted[:12]}{'...' if len(wanted) > 12 else ''} is outside "
                                  f"0..{num_classes - 1}")
            return resolve_target(loaded, logits, int(wanted))
        for i in range(num_classes):
            label = loaded.label(i).lower()
            if wanted in (label, label.split(",")[0].strip()):
                return i
        raise TargetError(target_message(target, [loaded.label(i) for i in range(num_classes)]))
    index = int(target)
    if not 0 <= index < num_classes:
        raise TargetError(f"class index {index} is outside 0..{num_classes - 1}")
    return index



@contextlib.contextmanager
def parameters_frozen(model: torch.nn.Module) -> Iterator[None]:
    """Inside the block no parameter requires grad (so backward writes no `.grad`); every parameter's
    `requires_grad` is restored on exit, also when the block raises."""
    with contextlib.ExitStack() as stack:
        for param in model.parameters():
            stack.callback(param.requires_grad_, param.requires_grad)
            param.requires_grad_(False)
        yield


@contextlib.contextmanager
def model_pass(loaded: LoadedModel) -> Iterator[None]:
    """A forward of the shared model without gradients: its lock held, eval mode, ViT Lens's float32 (`full_float32`:
    no TF32 on a GPU, linears on oneDNN on a CPU)."""
    with loaded.lock, torch.inference_mode(), eval_mode(loaded.model), full_float32(loaded.device):
        yield


def forward_lanes(loaded: LoadedModel, jobs: int) -> int:
    """How many of `jobs` independent forwards of `loaded` `forwards_on_lanes` runs at once: on a CPU one per torch
    thread (at most MAX_LANES and `jobs`), elsewhere 1 (a GPU runs one batch at a time best)."""
    if loaded.device.type != "cpu":
        return 1
    return max(1, min(torch.get_num_threads(), MAX_LANES, jobs))


def forwards_on_lanes(loaded: LoadedModel, forward: Callable[[Item], Result], items: Sequence[Item],
                      done: Callable[[int, Result], None] | None = None) -> list[Result]:
    """`forward(item)` for each of `items` (each a forward of the shared model without gradients), under the model's
    lock (`model_pass`); `done(i, result)` on the calling thread as each result arrives, in order. Returns the results
    in the items' order.

    On a CPU with n torch threads the forwards run on n lanes of 1 thread each (`forward_lanes`; one thread also
    when there is one lane, so that a result never depends on how many forwards there were), each lane taking
    the next item as it frees up, instead of one after another with n threads each: an n-thread operation waits at
    its barrier for the thread that lost its core to any other process (the browser drawing the page beside the
    server), while a lane that loses its core holds up only its own forward (docs/performance.md, "The judge's
    forwards on lanes"). If `done` raises (a rerun interrupting the page), the forwards not yet started are
    dropped.

    Without a `between_batches` hook the lock is held once for all items. With one it is taken for one slice of
    `lanes` items at a time, the hook called before each slice (its caller may let other forwards in there, or end
    the run by raising). A lane thread is started by the calling thread and inherits its priority (Linux)."""
    results: list[Result] = []
    lanes = forward_lanes(loaded, len(items))
    hook = _between_batches.get()
    per_hold = max(1, len(items) if hook is None else lanes)
    # One torch thread per forward on a CPU, however many lanes run: some kernels split a sum by thread count
    # (torch's attention for a single query row does), so the count would decide the last bits.
    threads = 1 if loaded.device.type == "cpu" else None

    def on_a_lane(item: Item) -> Result:  # inference mode and the float32 choice are per thread: set them here
        with torch_threads(threads), torch.inference_mode(), full_float32(loaded.device):
            return forward(item)

    pool = None if lanes == 1 else ThreadPoolExecutor(lanes, thread_name_prefix="vit-lens-lane")
    try:
        for first in range(0, len(items), per_hold):
            if hook is not None:
                hook()
            with model_pass(loaded):
                if pool is None:
                    with torch_threads(threads):
                        for i in range(first, min(first + per_hold, len(items))):
                            results.append(forward(items[i]))
                            if done is not None:
                                done(i, results[-1])
                    continue
                running = [pool.submit(on_a_lane, item) for item in items[first:first + per_hold]]
                try:
                    for i, future in enumerate(running, start=first):
                        results.append(future.result())
                        if done is not None:
                            done(i, results[-1])
                finally:  # the lock is held until no lane of this slice runs the model
                    for future in running:
                        future.cancel()
                    wait(running)
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    return results


def model_input(loaded: LoadedModel, image: Image.Image | Capture) -> torch.Tensor:
    """The normalised model input (1, 3, H, W) of `image`, on the model's device: a picture preprocessed as the
    capture does, or a Capture of it, whose `input_tensor` is exactly that input (no second decode and preprocessing)."""
    if isinstance(image, Capture):
        x = torch.tensor(image.input_tensor).unsqueeze(0)  # (3, H, W) -> (1, 3, H, W), a writable copy
    else:
        x = preprocess(loaded, image)[1]
    return on_model_device(loaded.model, x)
