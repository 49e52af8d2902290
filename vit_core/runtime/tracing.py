"""A forward recorded once as a TorchScript trace, kept only where it gives the eager forward's values bit for bit.

A trace runs its whole recorded graph in C++, without the GIL between operators: a server's capture passes
(vit_core.serving.traced) and the dataset engine's forwards on several workers (vit_core.dataset.reductions) use it
for that. `torch.jit.trace` records the operators one input took, so a trace is checked before it is used: on that
input and on it mirrored (a ViT's forward has no branch that depends on the pixels; a model that had one would show
it here), each output equal to the eager forward's in every bit. `torch.jit.trace` is deprecated (a FutureWarning
since torch 2.10): torch.compile's and torch.export's programs still come back to Python between operations, so
nothing else in torch does this; without torch.jit the forward stays eager.
"""

from __future__ import annotations

import logging
import warnings
from typing import Callable

import torch

_logger = logging.getLogger(__name__)

TracedGraph = Callable[..., tuple[torch.Tensor, ...]]


def exact_trace(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], name: str) -> TracedGraph | None:
    """`module` (whose forward returns a tuple of tensors) traced on `inputs`, the first of them an image batch
    (F, 3, H, W): a function of inputs of the same shapes that runs the recorded operators as they are (no graph
    optimisation, which may fuse them into other arithmetic). None where the model stays eager: torch without jit,
    tracing failing, or the trace's outputs differing from the module's eager ones in any bit, on `inputs` or on
    them with the image batch mirrored. Runs the eager forward twice and records it once, in the caller's autograd
    mode and torch threads (a trace keeps the library each linear was given at that thread count). `name` says in
    the log what stays eager."""
    if not hasattr(torch, "jit"):
        return None
    checks = [inputs, (inputs[0].flip(-1), *inputs[1:])]
    try:
        expected = [module(*check) for check in checks]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation, and TracerWarnings on timm's shape asserts
            graph = torch.jit.trace(module, inputs, check_trace=False)

        def traced(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            with torch.jit.optimized_execution(False):  # the recorded operators, the eager forward's arithmetic
                return graph(*args)

        exact = all(len(got) == len(want) and all(map(torch.equal, got, want))
                    for got, want in zip((traced(*check) for check in checks), expected, strict=True))
    except Exception as e:  # noqa: BLE001 - a model the tracer can't record stays eager
        _logger.info("%s stays eager (tracing failed: %s)", name, e)
        return None
    if not exact:
        _logger.info("%s stays eager (its trace differs from the eager forward)", name)
        return None
    return traced
