"""Every `VIT_LENS_*` environment variable, read one way: the one module that reads the process's configuration.
The runtime (threads, devices, oneDNN), the server's set-up (`vit_core.serving`) and the dashboard ask it.

A leaf module: it imports nothing of ViT Lens and nothing heavy, so that the server's launcher can read a setting
before torch is imported. Each setting is read when asked (tests and the launcher change the environment), never
cached. docs/serving.md has the same table for people; tests/unit/test_settings.py keeps the two in step.

    from vit_core import settings
    settings.WEIGHTS_UPLOADS.on()      # a flag: on, 1, true, yes / off, 0, false, no (any case); unset or "" = default
    settings.THREADS.number()          # a whole number >= 0; 0 = "decide from the machine"
    settings.MODEL.text()              # stripped text; unset or "" = default
    settings.ONEDNN_LINEAR.mode()      # auto, or a flag's on / off
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, Mapping

_ON = ("1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")


class SettingError(ValueError):
    """A `VIT_LENS_*` variable holds a value its setting can't take. (A ValueError, not a ViTLensError: this
    module imports nothing of the project; the CLI and the server report it in one line all the same.)"""


@dataclass(frozen=True)
class Setting:
    name: str  # the environment variable
    kind: Literal["flag", "number", "text", "mode"]  # mode: auto, or any spelling of on / off
    default: str  # as it would be written in the environment
    meaning: str  # one sentence for docs/serving.md's table
    who: Literal["server", "library"]  # read by the dashboard's server only, or by the library too

    def raw(self, env: Mapping[str, str] | None = None) -> str:
        return (os.environ if env is None else env).get(self.name, "").strip()

    def on(self, env: Mapping[str, str] | None = None) -> bool:
        assert self.kind == "flag", f"{self.name} is a {self.kind} setting"
        value = (self.raw(env) or self.default).lower()
        if value in _ON:
            return True
        if value in _OFF:
            return False
        raise SettingError(f"{self.name}={value!r}: use on or off.")

    def mode(self, env: Mapping[str, str] | None = None) -> Literal["auto", "on", "off"]:
        assert self.kind == "mode", f"{self.name} is a {self.kind} setting"
        value = (self.raw(env) or self.default).lower()
        if value == "auto":
            return "auto"
        if value in _ON:
            return "on"
        if value in _OFF:
            return "off"
        raise SettingError(f"{self.name}={value!r}: use auto, on or off.")

    def number(self, env: Mapping[str, str] | None = None) -> int:
        assert self.kind == "number", f"{self.name} is a {self.kind} setting"
        value = self.raw(env) or self.default
        try:
            number = int(value)
        except ValueError:
            raise SettingError(f"{self.name}={value!r}: use a whole number.") from None
        if number < 0:
            raise SettingError(f"{self.name}={value!r}: use a whole number, 0 or more.")
        return number

    def text(self, env: Mapping[str, str] | None = None) -> str:
        assert self.kind == "text", f"{self.name} is a {self.kind} setting"
        return self.raw(env) or self.default


MODEL = Setting("VIT_LENS_MODEL", "text", "vit_base_patch16_224",
                "The model the dashboard opens with: a timm name, `vit-lens/shapes-vit` or `test-tiny`.", "server")
RANDOM_INIT = Setting("VIT_LENS_RANDOM_INIT", "flag", "off",
                      "Build every timm model with random weights (structure only, nothing downloaded).", "server")
WEIGHTS_UPLOADS = Setting("VIT_LENS_WEIGHTS_UPLOADS", "flag", "on",
                          "Offer \"Your own weights file...\" in the model picker; off for a class.", "server")
ANY_MODEL = Setting("VIT_LENS_ANY_MODEL", "flag", "on",
                    "Let the picker take any ViT-family timm name or hf-hub id, not only its list; off for a class.",
                    "server")
DEVICE = Setting("VIT_LENS_DEVICE", "text", "auto",
                 "Where the server's models run: auto (CUDA, then Apple MPS, then the CPU), cpu, cuda, cuda:N or mps.",
                 "server")
THREADS = Setting("VIT_LENS_THREADS", "number", "0",
                  "torch's thread count; 0 = the CPUs this process may use (its cgroup quota and affinity).", "library")
MODEL_WORKERS = Setting("VIT_LENS_MODEL_WORKERS", "number", "0",
                        "Forwards at once over many images on a CPU (`dataset`, `concepts`, the Many images page), each "
                        "at one torch thread; 0 = the CPUs this process may use.", "library")
PARALLEL_PASSES = Setting("VIT_LENS_PARALLEL_PASSES", "number", "0",
                          "Capture passes of one model at once on the server; 0 = the thread count, at most 4.", "server")
TRACED_FORWARD = Setting("VIT_LENS_TRACED_FORWARD", "flag", "on",
                         "Run the server's CPU capture through a TorchScript trace that needs no GIL.", "server")
ONEDNN_LINEAR = Setting("VIT_LENS_ONEDNN_LINEAR", "mode", "off",
                        "Float32 CPU linears without gradients on oneDNN instead of MKL (x86-64): auto = where a "
                        "measurement at start finds oneDNN faster, on = always. Either changes the last bits of "
                        "results from one process to the next; off keeps them reproducible.", "library")
GRADIENT_THREADS = Setting("VIT_LENS_GRADIENT_THREADS", "number", "1",
                           "torch threads of a gradient pass (relevance maps, LRP), the same in every process whatever "
                           "its own thread setting (a backward's sums can depend on the thread count); 0 = the CPUs a "
                           "process may use on this machine. 1 gives the same maps whatever CPUs a machine has and "
                           "never waits for a busy core.", "library")
CAPTURE_MB = Setting("VIT_LENS_CAPTURE_MB", "number", "0",
                     "MB the server's shared captures may take; 0 = a quarter of the memory, 512 to 8192 MB.", "server")
HUGE_PAGES = Setting("VIT_LENS_HUGE_PAGES", "flag", "off",
                     "Restart the server once with glibc's malloc on transparent huge pages (Linux, glibc).", "server")
STATIC_LESSON = Setting("VIT_LENS_STATIC_LESSON", "text", "",
                        "The address of the class's static lesson (`vit-lens export-web`), which the Lesson page "
                        "links to; empty: the page names the command.", "server")
LENSES = Setting("VIT_LENS_LENSES", "text", "",
                 "Lens files or modules (vit_core.lenses), separated by the path separator (: or ;), their "
                 "lenses offered in the Lenses tab; read at start only, never from a page.", "server")

CONCEPTS = Setting("VIT_LENS_CONCEPTS", "text", "",
                   "Concept folders (`vit-lens concepts` DIRs, separated by `:`, `;` on Windows) that the Concepts tabs "
                   "offer by their names, beside the bundled Shapes ViT concepts; `--concepts DIR` adds one.", "server")

ALL: tuple[Setting, ...] = (MODEL, RANDOM_INIT, WEIGHTS_UPLOADS, ANY_MODEL, DEVICE, THREADS, MODEL_WORKERS, PARALLEL_PASSES,
                            TRACED_FORWARD, ONEDNN_LINEAR, GRADIENT_THREADS, CAPTURE_MB, HUGE_PAGES, STATIC_LESSON,
                            CONCEPTS, LENSES)


def check_all(env: Mapping[str, str] | None = None) -> None:
    """Read every setting once, so that a program stops at its start, in one line, on a value a setting can't take
    (a server would otherwise meet it later, inside some student's page). Raises the first SettingError."""
    for setting in ALL:
        {"flag": setting.on, "number": setting.number, "text": setting.text, "mode": setting.mode}[setting.kind](env)
