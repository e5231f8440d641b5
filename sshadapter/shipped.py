"""The files shipped beside the code: example operations, units, rules, docs.

A checkout has them at its root; a wheel or sdist install has them under
``sshadapter/examples/``, mapped from the same directories by pyproject.toml
(``[tool.setuptools.package-dir]``), so git holds one copy. ``sshadapter demo``
runs on them and ``sshadapter examples --write DIR`` writes them out for an
operator to install. Standard library only: ``--help`` names the docs from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from sshadapter.safe_write import TargetDirectory

# The directories and files an installed copy carries, the same names as
# pyproject.toml's sshadapter.examples.* packages (tests/test_package.py checks both).
SHIPPED_DIRECTORIES: Final = ("commands", "schemas", "systemd", "prometheus", "docs")
SHIPPED_FILES: Final = (
    "config.example.toml",
    "README.md",
    "CHANGELOG.md",
    "SECURITY.md",
    "LICENSE",
)
# The directories without which there is no demo and no example to install.
REQUIRED: Final = ("commands", "schemas")
FILE_MODE: Final = 0o644  # the examples are public text, read by whoever installs them

_PACKAGE: Final = Path(__file__).resolve().parent
CHECKOUT: Final = _PACKAGE.parent
"""A source checkout (an editable install) runs from here: the repository's own files."""
INSTALLED: Final = _PACKAGE / "examples"
"""A wheel or sdist install: the same files as package data."""


class ExamplesMissing(Exception):
    """The shipped files are in neither place: a broken or partial install."""


def examples_root() -> Path:
    """Where the shipped files are: the checkout first (edits show at once), then the package."""
    for candidate in (CHECKOUT, INSTALLED):
        if all((candidate / name).is_dir() for name in REQUIRED):
            return candidate
    raise ExamplesMissing(
        f"no commands/ and schemas/ in {INSTALLED} (the installed package data) or "
        f"{CHECKOUT} (a checkout): reinstall sshadapter from its wheel or sdist"
    )


def docs_location() -> str:
    """The reference docs for ``--help``: the installed or checked-out docs/ directory."""
    try:
        return str(examples_root() / "docs")
    except ExamplesMissing:
        return "docs/ in the sdist"


def write_examples(target: Path) -> list[str]:
    """Copy the shipped files into ``target`` (new or empty); the names written, sorted.

    Never overwrites: an operator's edited copy is not replaced by the examples. Written
    through sshadapter/safe_write.py: ``target`` is created, or must be the writer's own
    and writable by nobody else, and nothing is written through a link; the files are
    public text, 0644.
    """
    from sshadapter.safe_write import TargetDirectory

    source = examples_root()
    with TargetDirectory.open(target, key="--write", create=True) as out:
        if out.names():
            raise FileExistsError(f"{target} exists and is not an empty directory")
        written: list[str] = []
        for name in SHIPPED_DIRECTORIES:
            if (source / name).is_dir():
                with out.subdirectory(name) as copy:
                    _copy_tree(source / name, copy)
                written.append(f"{name}/")
        for name in SHIPPED_FILES:
            if (source / name).is_file():
                out.create(name, (source / name).read_bytes(), FILE_MODE)
                written.append(name)
    return sorted(written)


def _copy_tree(source: Path, out: TargetDirectory) -> None:
    """Each file and directory under ``source`` made anew in ``out`` (bytecode caches left)."""
    for entry in sorted(source.iterdir()):
        if entry.name == "__pycache__":
            continue
        if entry.is_dir():
            with out.subdirectory(entry.name) as copy:
                _copy_tree(entry, copy)
        else:
            out.create(entry.name, entry.read_bytes(), FILE_MODE)
