"""Creating the model a name resolves to: the bundled teaching model, timm's pretrained weights from the Hugging Face
hub (the local cache first, and within seconds when offline), or timm's random init under a seed.

Without a network, `timm.create_model(pretrained=True)` spends about 47 s in retries before it fails; here a
HEAD probe with a deadline decides first, and a cached file is loaded through timm's own path with no round trip.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import urllib.request
from typing import Any

import timm
import torch

from ..errors import ModelError, OfflineError, WeightsError
from ..teaching.model import BUNDLED_DIR, TEACHING_MODEL, load_shapes_vit  # importing it registers the Shapes ViT
from .names import check_supported

_logger = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT_S = 3.0
TEACHING_MODEL_DIR = BUNDLED_DIR  # package data: vit_core/assets/shapes_vit


def create_model(name: str, probe: torch.nn.Module | None, *, pretrained: bool, seed: int,
                 **model_kwargs: Any) -> tuple[torch.nn.Module, str]:
    """The model `name` resolved to, in eval mode, and where its weights came from (for people): the bundled
    teaching model, timm's pretrained weights, or timm's random init under `seed`. `probe`: the architecture
    checked on 'meta' by `resolve_name`; where there was none, the model built here is checked instead."""
    if name == TEACHING_MODEL:
        model, source = _teaching_model(), f"bundled: {TEACHING_MODEL_DIR.name}"
    elif pretrained:
        model, source = create_pretrained(name, **model_kwargs)
    else:
        model, source = random_init(name, seed, model_kwargs), f"random init (seed {seed})"
    if probe is None:
        check_supported(model, name)
    return model.eval(), source


def random_init(name: str, seed: int, model_kwargs: dict[str, Any]) -> torch.nn.Module:
    """timm's random init of `name`, deterministic under `seed`, leaving the global RNG as it was."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return timm_create(name, pretrained=False, **model_kwargs)


def teaching_model_available() -> bool:
    return (TEACHING_MODEL_DIR / "model.safetensors").is_file()


def _teaching_model() -> torch.nn.Module:
    """The bundled Shapes ViT through its timm registration (vit_core.teaching.model); its label names are in
    its pretrained config."""
    if not teaching_model_available():
        raise ModelError("The bundled teaching model is missing from this installation (vit_core/assets/shapes_vit); "
                         "retrain it (see its MODEL_CARD.md).")  # the package's folder, not the server's path
    try:
        model, _ = load_shapes_vit(TEACHING_MODEL_DIR)
    except RuntimeError as e:  # timm's strict load: missing / unexpected keys or a shape mismatch
        raise WeightsError(f"The bundled teaching model's weights don't fit its config: {e}") from e
    return model


def _probe(url: str, answer: list[bool]) -> None:
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=HUB_PROBE_TIMEOUT_S).close()
        answer.append(True)
    except urllib.error.HTTPError:
        answer.append(True)  # the server answered: the network is there
    except (OSError, ValueError) as e:
        _logger.info("hub %s not reachable: %s", url, e)
        answer.append(False)


@functools.lru_cache(maxsize=1)
def _hub_reachable_at(bucket: int) -> bool:
    del bucket  # only keys the cache: one probe a minute at most
    from huggingface_hub import constants

    # urllib's timeout does not cover the DNS lookup, which can hang on a broken network: the probe
    # runs in a daemon thread and whatever it hasn't answered by the deadline counts as offline.
    answer: list[bool] = []
    probe = threading.Thread(target=_probe, args=(constants.ENDPOINT, answer), daemon=True)
    probe.start()
    probe.join(HUB_PROBE_TIMEOUT_S + 0.5)
    return bool(answer and answer[0])


def hub_reachable() -> bool:
    """Whether the Hugging Face hub answers within a few seconds (cached for a minute)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    return _hub_reachable_at(int(time.time() // 60))


def _cached_weights_file(hub_id: str) -> str | None:
    """Path of a weights file of `hub_id` already in the local hub cache, if any."""
    from huggingface_hub import try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin"):
        path = try_to_load_from_cache(hub_id, filename)
        if isinstance(path, str):
            return path
    return None


def _offline_message(what: str) -> str:
    return (
        f"Pretrained weights for {what} are not in the local cache and the Hugging Face hub can't be "
        "reached. Connect once to download them, point HF_HOME at a cache that has them, pass a "
        f"weights file, or use the bundled offline model {TEACHING_MODEL!r}."
    )


def create_pretrained(name: str, **kwargs: Any) -> tuple[torch.nn.Module, str]:
    """timm.create_model(pretrained=True), but from the hub cache when possible and never slow offline."""
    if name.startswith("hf-hub:"):
        hub_id = name[len("hf-hub:"):]
        from huggingface_hub import constants

        if not constants.HF_HUB_OFFLINE and not hub_reachable():
            raise OfflineError(_offline_message(name) + " (With HF_HUB_OFFLINE=1, hub ids are read from the cache.)")
        return timm_create(name, pretrained=True, **kwargs), f"hub: {hub_id}"

    cfg = timm.models.get_pretrained_cfg(name)
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id:
        raise ModelError(f"timm has no pretrained weights for {name}; load it with pretrained=False or a weights file.")
    cached = _cached_weights_file(hub_id)
    if cached:
        # timm's own load path, pointed at the cached file: no network round trip at all.
        model = timm_create(name, pretrained=True, pretrained_cfg_overlay={"file": cached}, **kwargs)
        return model, f"hub cache: {hub_id}"
    if not hub_reachable():
        raise OfflineError(_offline_message(name))
    _logger.info("downloading %s from the hub", hub_id)
    return timm_create(name, pretrained=True, **kwargs), f"hub: {hub_id}"


def timm_create(name: str, **kwargs: Any) -> torch.nn.Module:
    try:
        return timm.create_model(name, **kwargs)
    except (OSError, RuntimeError) as e:
        from huggingface_hub.errors import LocalEntryNotFoundError

        if isinstance(e, LocalEntryNotFoundError) or isinstance(e.__cause__, LocalEntryNotFoundError):
            raise OfflineError(_offline_message(name)) from e
        raise
