"""Every VIT_LENS_* variable is read one way (vit_core.settings), and docs/serving.md's table says the same."""

import re
import subprocess
import sys

import pytest

from conftest import REPO
from vit_core import settings


@pytest.mark.parametrize("value, expected", [("on", True), ("ON", True), ("1", True), ("true", True), ("yes", True),
                                             ("off", False), ("Off", False), ("0", False), ("false", False),
                                             ("no", False), (" off ", False)])
def test_a_flag_reads_every_spelling_of_on_and_off(monkeypatch, value, expected):
    monkeypatch.setenv(settings.RANDOM_INIT.name, value)
    assert settings.RANDOM_INIT.on() is expected


def test_random_init_off_means_off_and_unset_or_empty_means_the_default(monkeypatch):
    """At 73446a6 `VIT_LENS_RANDOM_INIT=off` turned random init on (dashboard/models.py:137)."""
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "off")
    assert settings.RANDOM_INIT.on() is False
    monkeypatch.setenv("VIT_LENS_RANDOM_INIT", "")
    assert settings.RANDOM_INIT.on() is False and settings.WEIGHTS_UPLOADS.on() is True
    monkeypatch.delenv("VIT_LENS_RANDOM_INIT")
    assert settings.RANDOM_INIT.on() is False


def test_a_value_a_setting_cant_take_is_one_sentence_naming_the_variable(monkeypatch):
    monkeypatch.setenv("VIT_LENS_TRACED_FORWARD", "maybe")
    with pytest.raises(settings.SettingError, match=r"^VIT_LENS_TRACED_FORWARD='maybe': use on or off\.$"):
        settings.TRACED_FORWARD.on()
    for bad in ("two", "-1", "1.5"):
        monkeypatch.setenv("VIT_LENS_THREADS", bad)
        with pytest.raises(settings.SettingError, match=r"^VIT_LENS_THREADS="):
            settings.THREADS.number()
    monkeypatch.setenv("VIT_LENS_THREADS", " 3 ")
    assert settings.THREADS.number() == 3


def test_text_settings_are_stripped_and_fall_back_to_the_default(monkeypatch):
    monkeypatch.setenv("VIT_LENS_DEVICE", "  cuda:1 ")
    assert settings.DEVICE.text() == "cuda:1"
    monkeypatch.setenv("VIT_LENS_DEVICE", "   ")
    assert settings.DEVICE.text() == "auto"
    assert settings.MODEL.text({}) == "vit_base_patch16_224"
    assert settings.HUGE_PAGES.on({"VIT_LENS_HUGE_PAGES": "on"}) is True  # an environment given, not this process's


def test_every_default_is_a_value_its_own_parser_takes_and_check_all_finds_a_bad_one():
    settings.check_all({})
    with pytest.raises(settings.SettingError, match="VIT_LENS_CAPTURE_MB='lots'"):
        settings.check_all({"VIT_LENS_WEIGHTS_UPLOADS": "off", "VIT_LENS_CAPTURE_MB": "lots"})


def test_no_module_reads_a_vit_lens_variable_except_through_settings():
    """One parser: no module reads a variable itself (setting one for a child process, as the tools do, is fine)."""
    offenders = []
    for package in ("vit_core", "dashboard", "tools"):
        for path in (REPO / package).rglob("*.py"):
            if path.name == "settings.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                code = line.split("#", 1)[0]
                if re.search(r"""(environ\.get|getenv)\(\s*["']VIT_LENS_|environ\[["']VIT_LENS_[A-Z_]+["']\](?!\s*=)""", code):
                    offenders.append(f"{path.relative_to(REPO)}:{number}")
    assert offenders == []


def test_importing_the_settings_loads_no_torch():
    """The server's launcher reads VIT_LENS_HUGE_PAGES before it restarts itself, when nothing heavy may be loaded yet."""
    code = "import sys, vit_core.settings; print('torch' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == "False False", out.stderr


def test_docs_serving_lists_every_setting_with_its_default():
    """docs/serving.md's table has one row per setting, `NAME` and `default` in its first two columns."""
    rows = re.findall(r"^\|\s*`(VIT_LENS_[A-Z_]+)`\s*\|\s*`([^`]*)`\s*\|", (REPO / "docs" / "serving.md").read_text(),
                      re.MULTILINE)
    assert dict(rows) == {s.name: s.default for s in settings.ALL}
    assert len(rows) == len(settings.ALL)
