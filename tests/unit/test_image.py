"""deploy/image/Containerfile, read as a build would read it. No base image can be pulled on
these machines (no registry), so the image is not built here: these checks keep the file true to
the repository (what it copies exists, what the manifests run is in the package it installs,
the Python it builds on is one the package supports)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONTAINERFILE = REPO / "deploy" / "image" / "Containerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", CONTAINERFILE.read_text())
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_what_it_copies_from_the_repository_exists() -> None:
    copies = [args.split() for word, args in instructions() if word == "COPY" and "--from=" not in args]
    assert copies, "the Containerfile copies nothing from the repository"
    for *sources, _ in copies:
        for source in sources:
            assert (REPO / source).exists(), source
    # Everything setup.py's build needs: the wheel compiles native/ (setup.py) from these.
    copied = {s for *sources, _ in copies for s in sources}
    assert {"pyproject.toml", "setup.py", "MANIFEST.in", "native", "src"} <= copied


def test_it_builds_on_a_python_the_package_supports() -> None:
    (python,) = [args for word, args in instructions() if word == "ARG" and args.startswith("PYTHON=")]
    version = re.match(r"PYTHON=(\d+)\.(\d+)-", python)
    assert version is not None, python
    required = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    low = re.match(r">=(\d+)\.(\d+)$", required)
    assert low is not None, required
    assert (int(version[1]), int(version[2])) >= (int(low[1]), int(low[2]))
    bases = [args for word, args in instructions() if word == "FROM"]
    assert len(bases) == 2
    assert all(b.startswith("docker.io/library/python:${PYTHON}") for b in bases)


def test_the_manifests_run_what_the_image_installs() -> None:
    header = CONTAINERFILE.read_text().split("\n\n", 1)[0]
    kustomization = yaml.safe_load((REPO / "deploy/kubernetes/base/kustomization.yaml").read_text())
    (ours,) = [i for i in kustomization["images"] if "sharegpu" in i["name"]]
    assert f"({ours['name']})" in header
    commands = []
    for path in (REPO / "deploy/kubernetes/base").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container.get("image") == ours["name"]:
                    commands.append(container["command"])
    assert commands
    for command in commands:
        if command[:2] == ["python", "-m"]:
            module = REPO / "src" / Path(*command[2].split("."))
            assert module.with_suffix(".py").exists() or (module / "__main__.py").exists(), command
        else:
            assert command[0] == "sharegpu", command  # the package's console script
    installed = " ".join(args for word, args in instructions() if word == "RUN")
    assert "--no-index --find-links /wheels sharegpu" in installed
