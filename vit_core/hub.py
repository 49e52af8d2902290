"""Pretrained weights from the Hugging Face hub through timm: the local cache first, and within seconds when offline.

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

from .errors import ModelError, OfflineError
from .teaching.model import TEACHING_MODEL

_logger = logging.getLogger(__name__)

HUB_PROBE_TIMEOUT_S = 3.0


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


# ----------------------------------------------------------------------------------------------
# Weights files
