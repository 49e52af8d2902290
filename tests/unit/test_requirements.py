"""requirements.txt (the versions the suite last passed with) agrees with pyproject.toml (the supported ranges):
every runtime dependency is pinned there with ==, to a version its range admits, on every platform where
pyproject asks for it and on no other."""

from __future__ import annotations

import pytest
import tomllib  # Python 3.11+: the tests' interpreter
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import REPO

# The platforms the markers are read for: a dependency's line must apply exactly where pyproject's does.
PLATFORMS = {
    "linux": {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix", "platform_machine": "x86_64"},
    "macos": {"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix", "platform_machine": "arm64"},
    "windows": {"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt", "platform_machine": "AMD64"},
}


def pinned(text: str) -> tuple[dict[str, list[Requirement]], list[str]]:
    """requirements.txt's requirements by canonical name, and its other lines (options such as `-e .`)."""
    requirements: dict[str, list[Requirement]] = {}
    others = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            others.append(line)
            continue
        requirement = Requirement(line)
        requirements.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return requirements, others


def applies(requirement: Requirement, environment: dict[str, str]) -> bool:
    return requirement.marker is None or requirement.marker.evaluate({**environment, "extra": ""})


def mismatches(pyproject: dict, requirements_text: str) -> list[str]:
    """What is wrong between pyproject's [project] dependencies and requirements.txt's pins (empty: they agree)."""
    pins, _ = pinned(requirements_text)
    problems = []
    for lines in pins.values():
        for line in lines:
            specifiers = list(line.specifier)
            if len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
                problems.append(f"{line}: not pinned to one version with ==")
    for text in pyproject["project"]["dependencies"]:
        wanted = Requirement(text)
        lines = pins.get(canonicalize_name(wanted.name), [])
        if not lines:
            problems.append(f"{wanted}: missing from requirements.txt")
            continue
        for platform, overrides in PLATFORMS.items():
            environment = {**default_environment(), **overrides}
            there = [line for line in lines if applies(line, environment)]
            if not applies(wanted, environment):
                if there:
                    problems.append(f"{wanted.name} is pinned on {platform}, where pyproject does not ask for it")
                continue
            if len(there) != 1:
                problems.append(f"{wanted}: {len(there)} pins apply on {platform}, not one")
                continue
            version = next(iter(there[0].specifier)).version
            if not wanted.specifier.contains(version, prereleases=True):
                problems.append(f"{wanted.name}=={version} on {platform} is outside pyproject's {wanted.specifier}")
    return problems


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_dependency_is_pinned_within_its_range(pyproject):
    assert mismatches(pyproject, (REPO / "requirements.txt").read_text()) == []


def test_requirements_end_by_installing_the_project_editable():
    _, others = pinned((REPO / "requirements.txt").read_text())
    assert others == ["-e ."]  # `streamlit run dashboard/app.py` imports vit_core and dashboard from the checkout


def test_the_test_tools_are_not_pinned_as_runtime_dependencies(pyproject):
    pins, _ = pinned((REPO / "requirements.txt").read_text())
    test_tools = {canonicalize_name(Requirement(t).name) for t in pyproject["project"]["optional-dependencies"]["test"]}
    assert not test_tools & set(pins)


@pytest.mark.parametrize("name, line, message", [
    ("timm", "timm==1.1.0", "timm==1.1.0 on linux is outside pyproject's"),
    ("streamlit", "streamlit==1.68.0", "streamlit==1.68.0 on linux is outside pyproject's"),
    ("pillow", "pillow==12.1.1", "pillow==12.1.1 on linux is outside pyproject's"),
    ("torch", "torch>=2.15", "torch>=2.15: not pinned to one version with =="),
    ("tqdm", "", "missing from requirements.txt"),
    ("uvloop", "uvloop==0.23.0", "uvloop is pinned on windows, where pyproject does not ask for it"),
    ("uvloop", 'uvloop==0.23.0; sys_platform == "linux"', "0 pins apply on macos, not one"),
])
def test_a_mismatch_is_caught(pyproject, name, line, message):
    """The check itself: a copy of requirements.txt with `name`'s line replaced by `line` is reported."""
    lines = (REPO / "requirements.txt").read_text().splitlines()
    (index,) = [i for i, text in enumerate(lines) if canonicalize_name(text.split("==")[0]) == name]
    lines[index] = line
    found = mismatches(pyproject, "\n".join(lines))
    assert any(message in problem for problem in found), found


def test_the_web_extra_is_pinned_within_its_range(pyproject):
    """`vit-lens export-web`'s optional dependencies (onnx, onnxruntime) are pinned as the runtime's are."""
    web = {"project": {"dependencies": pyproject["project"]["optional-dependencies"]["web"]}}
    assert mismatches(web, (REPO / "requirements.txt").read_text()) == []
