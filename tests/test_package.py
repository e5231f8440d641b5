"""The sdist and wheel carry what an operator needs, and an installed wheel works anywhere.

``python -m build`` builds the sdist from a copy of the working tree (every file git
tracks or would track), then the wheel from that sdist, as a release would. The wheel
must hold every module and, under ``sshadapter/examples/``, the example operations,
units, rules and docs. It is installed into a fresh venv (pip as configured on this
machine: its cache and local indexes first), and ``sshadapter demo`` and ``sshadapter
examples --write`` run from a directory that is not the checkout.
"""

from __future__ import annotations

import email
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest
from test_docs import _LINK

from sshadapter import __version__
from sshadapter.shipped import SHIPPED_DIRECTORIES, SHIPPED_FILES

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_SECONDS: Final = 300.0  # an isolated build env: setuptools from pip's cache, ~5 s
INSTALL_TIMEOUT_SECONDS: Final = 300.0  # a venv and the dependencies from pip's cache, ~10 s
DEMO_TIMEOUT_SECONDS: Final = 120.0  # the demo takes a few seconds (tests/cli/test_demo.py)


@dataclass(frozen=True)
class Built:
    """One build: the sdist, the wheel made from it, and the files git has in the tree."""

    sdist: Path
    wheel: Path
    tracked: list[str]


def _tree_files() -> list[str]:
    """What a clone of this tree holds: tracked files and new ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    tmp = tmp_path_factory.mktemp("package")
    source, dist = tmp / "source", tmp / "dist"
    tracked = _tree_files()
    for name in tracked:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes((ROOT / name).read_bytes())
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "SetuptoolsDeprecationWarning" not in done.stdout + done.stderr
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return Built(sdist, wheel, tracked)


@pytest.fixture(scope="module")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the wheel installed; yields its bin/ directory."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    done = subprocess.run(
        [str(venv / "bin/pip"), "install", "-q", str(built.wheel)],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    yield venv / "bin"


def _shipped(tracked: list[str]) -> list[str]:
    """The tree's files an install must carry, relative to sshadapter/examples/."""
    return [
        name
        for name in tracked
        if name in SHIPPED_FILES or name.split("/")[0] in SHIPPED_DIRECTORIES
    ]


def test_pyproject_maps_exactly_the_shipped_directories() -> None:
    """pyproject.toml's sshadapter.examples.* packages are sshadapter/shipped.py's list."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = {
        package.removeprefix("sshadapter.examples."): directory
        for package, directory in setuptools["package-dir"].items()
        if package.startswith("sshadapter.examples.")
    }
    assert mapped == {name: name for name in SHIPPED_DIRECTORIES}
    assert setuptools["package-dir"]["sshadapter.examples"] == "."
    assert set(setuptools["package-data"]["sshadapter.examples"]) == set(SHIPPED_FILES)
    # Every package of the tree is listed (the list replaces find: the data lives elsewhere).
    tree = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "sshadapter").rglob("__init__.py")
    }
    assert tree <= set(setuptools["packages"])


def test_the_wheel_and_sdist_carry_the_code_examples_and_license(built: Built) -> None:
    """Every module, every shipped example, unit, rule and doc, the LICENSE and the metadata."""
    with zipfile.ZipFile(built.wheel) as wheel:
        names = set(wheel.namelist())
        info = f"sshadapter-{__version__}.dist-info"
        metadata = email.message_from_bytes(wheel.read(f"{info}/METADATA"))
    modules = {name for name in built.tracked if name.startswith("sshadapter/")}
    assert modules <= names
    assert {f"sshadapter/examples/{name}" for name in _shipped(built.tracked)} <= names
    assert "sshadapter/examples/commands/load_average.fixtures/current.stdout" in names
    # The catalog loads from the installed package: its files, fixtures and schemas.
    catalog = {name for name in built.tracked if name.startswith("sshadapter/catalog/")}
    assert any(name.endswith("/PROVENANCE.md") for name in catalog)
    assert any(name.startswith("sshadapter/catalog/schemas/") for name in catalog)
    assert catalog <= names
    assert f"{info}/licenses/LICENSE" in names
    assert metadata["License-Expression"] == "MIT"
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert metadata.get_all("Project-URL") and metadata.get_all("Classifier")
    with tarfile.open(built.sdist) as sdist:
        carried = {name.partition("/")[2] for name in sdist.getnames()}
    assert set(_shipped(built.tracked)) <= carried


def test_the_sdist_ships_no_tests_and_the_wheel_is_typed(built: Built) -> None:
    """Tests run from a clone, not from the sdist; py.typed ships, as the classifier says."""
    with tarfile.open(built.sdist) as sdist:
        carried = {name.partition("/")[2] for name in sdist.getnames()}
    assert not {name for name in carried if name.startswith("tests/")}
    assert "sshadapter/py.typed" in carried
    with zipfile.ZipFile(built.wheel) as wheel:
        assert "sshadapter/py.typed" in wheel.namelist()
    classifiers = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["classifiers"]
    assert "Typing :: Typed" in classifiers


def test_the_written_examples_link_only_to_files_they_hold(installed: Path, tmp_path: Path) -> None:
    """Each relative link of the README and docs `examples --write` wrote resolves in its output."""
    wrote = subprocess.run(
        [str(installed / "sshadapter"), "examples", "--write", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
    )
    assert wrote.returncode == 0, wrote.stderr
    out = tmp_path / "out"
    documents = sorted(out.rglob("*.md"))
    assert out / "README.md" in documents and out / "docs" / "guide.md" in documents
    links = 0
    for document in documents:
        for target in _LINK.findall(document.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            links += 1
            resolved = (document.parent / target.partition("#")[0]).resolve()
            assert resolved.is_relative_to(out) and resolved.exists(), f"{document}: {target}"
    assert links > 20  # the pattern still finds them


def test_the_installed_wheel_runs_the_demo_and_writes_the_examples_anywhere(
    installed: Path, built: Built, tmp_path: Path
) -> None:
    """From a directory that is not the checkout: the demo, --help's docs, examples --write."""
    sshadapter = str(installed / "sshadapter")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sshadapter, *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_SECONDS,
            env={**os.environ, "COLUMNS": "1000"},  # --help's epilog on one line
        )

    demo = run("demo")
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert "Traceback" not in demo.stderr
    assert '"outcome":"success"' in demo.stdout
    helped = run("--help").stdout
    (docs,) = installed.parent.glob("lib/python*/site-packages/sshadapter/examples/docs")
    assert f"Reference: {docs};" in helped and (docs / "protocol.md").is_file()
    assert "sshadapter examples --write DIR" in helped
    wrote = run("examples", "--write", "out")
    assert wrote.returncode == 0, wrote.stderr
    for name in _shipped(built.tracked):
        assert (tmp_path / "out" / name).read_bytes() == (ROOT / name).read_bytes(), name
    again = run("examples", "--write", "out")
    assert again.returncode == 2
    assert again.stderr == "sshadapter examples: out exists and is not an empty directory\n"


def test_a_broken_install_says_so_in_one_line(installed: Path, tmp_path: Path) -> None:
    """Without its package data the demo and examples exit 2 with one line, no traceback."""
    venv = installed.parent
    broken = tmp_path / "venv"
    subprocess.run(["cp", "-a", str(venv), str(broken)], check=True)
    (examples,) = broken.glob("lib/python*/site-packages/sshadapter/examples")
    subprocess.run(["rm", "-r", str(examples / "commands")], check=True)
    python = str(broken / "bin/python")
    for command in (["demo"], ["examples", "--write", "out"]):
        done = subprocess.run(
            [python, "-m", "sshadapter.cli", *command],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_SECONDS,
        )
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
        assert "no commands/ and schemas/ in" in done.stderr
