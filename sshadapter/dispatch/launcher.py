#!/usr/bin/python3 -IS
"""sshadapter-dispatch: the forced command on a host; runs the dispatcher, compiled ahead if it can.

``sshadapter dispatcher --write PATH`` writes this launcher with the dispatcher's
source (sshadapter/dispatch/dispatcher.py) as ``SOURCE`` at its end: one file,
Python 3.9 or later, the standard library only. Reference: docs/dispatcher.md
"Start-up".

Every call starts a new interpreter, and compiling the dispatcher's source
costs ~4 ms of each. ``PATH --compile``, run once as root on the host (and
again after the host's Python or the file changes), writes the compiled code
next to it, ``PATH.compiled``. A call runs that code only if it is as trusted
as the policy and made from this very source by this very interpreter:

- read as the policy is (dispatcher.read_policy_bytes): walked from ``/``
  without following a symbolic link, the file and every directory above it
  owned by root (or the forced command's ``--policy-owner``) and writable by
  nobody else, a regular file of at most MAX_CODE_BYTES;
- its header names the running interpreter's bytecode magic number and cache
  tag, and the sha256 of ``SOURCE`` in this file;
- it holds one code object.

Otherwise (missing, stale, from another Python, unsafe, malformed) the call
compiles ``SOURCE``: the same code, ~4 ms slower, never other code.
"""

import _stat
import marshal
import posix
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from hashlib import sha256 as _SHA256
    from types import CodeType
    from typing import Any
else:
    try:  # the builtin sha256: _sha256 up to 3.11, _sha2 since 3.12; else hashlib's
        from _sha256 import sha256 as _SHA256
    except ImportError:  # pragma: no cover - depends on the host's Python
        try:
            from _sha2 import sha256 as _SHA256
        except ImportError:
            from hashlib import sha256 as _SHA256

CODE_FORMAT = "sshadapter-dispatch-code/1"
CODE_SUFFIX = ".compiled"  # PATH.compiled, next to PATH
COMPILE_OPTION = "--compile"
# The compiled dispatcher is ~45 KB; a file far larger is not one `--compile` wrote.
MAX_CODE_BYTES = 1024 * 1024
# As the dispatcher's policy: root (and --policy-owner) only, no group or other write bit.
TRUSTED_OWNER = 0
UNSAFE_MODE_BITS = 0o022
# The forced command's options (dispatcher._OPTIONS): each takes a value, each at most once.
_OPTIONS = ("--log-socket", "--policy-owner")
_DIRECTORY_FLAGS = (
    getattr(posix, "O_PATH", posix.O_RDONLY)
    | posix.O_DIRECTORY
    | posix.O_NOFOLLOW
    | posix.O_CLOEXEC
)
_FILE_FLAGS = (
    posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_NONBLOCK | posix.O_NOCTTY | posix.O_CLOEXEC
)
TAG = "sshadapter-dispatch"
CANNOT_EXECUTE_STATUS = 126  # dispatcher.CANNOT_EXECUTE_STATUS, as a shell says it


def owners(args: "list[str]") -> "set[int]":
    """Root, and the forced command's ``--policy-owner UID`` (read as dispatcher._options)."""
    found, seen = {TRUSTED_OWNER}, set()
    while len(args) >= 2 and args[0] in _OPTIONS and args[0] not in seen:
        if args[0] == "--policy-owner" and args[1].isdigit() and args[1].isascii():
            found.add(int(args[1]))
        seen.add(args[0])
        args = args[2:]
    return found


def read_trusted(path: str, allowed: "set[int]") -> "bytes | None":
    """The file's bytes if only ``allowed`` owners could have written them, else None.

    dispatcher.read_policy_bytes' walk: from ``/``, one component at a time,
    each opened relative to the last without following a symbolic link and
    checked on the open descriptor.
    """
    names = path.split("/")[1:] if path.startswith("/") else []
    if not names or any(name in ("", ".", "..") for name in names):
        return None
    try:
        fd = posix.open("/", _DIRECTORY_FLAGS)
    except OSError:
        return None
    try:
        info = posix.fstat(fd)
        for depth, name in enumerate(names):
            if info.st_uid not in allowed or info.st_mode & UNSAFE_MODE_BITS:
                return None
            last = depth == len(names) - 1
            opened = posix.open(name, _FILE_FLAGS if last else _DIRECTORY_FLAGS, dir_fd=fd)
            posix.close(fd)
            fd = opened
            info = posix.fstat(fd)
        if info.st_uid not in allowed or info.st_mode & UNSAFE_MODE_BITS:
            return None
        if not _stat.S_ISREG(info.st_mode) or info.st_size > MAX_CODE_BYTES:
            return None
        data = posix.read(fd, MAX_CODE_BYTES + 1)  # one read: a regular file, not a pipe
    except OSError:
        return None
    finally:
        posix.close(fd)
    return data if len(data) <= MAX_CODE_BYTES else None


def header(source: str) -> bytes:
    """What the compiled file starts with: format, bytecode magic, cache tag, source digest."""
    # importlib.util.MAGIC_NUMBER, from the frozen module every CPython has already loaded
    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"").hex()
    digest = _SHA256(source.encode("utf-8")).hexdigest()
    return f"{CODE_FORMAT} {magic} {sys.implementation.cache_tag} sha256:{digest}\n".encode()


def compiled(script: str, source: str, allowed: "set[int]") -> "CodeType | None":
    """The code of ``script + CODE_SUFFIX`` when it is trusted and made from ``source`` here."""
    data = read_trusted(script + CODE_SUFFIX, allowed)
    expected = header(source)
    if data is None or not data.startswith(expected):
        return None
    try:
        code = marshal.loads(data[len(expected) :])  # noqa: S302 - root's file, read_trusted
    except (EOFError, ValueError, TypeError):
        return None
    return code if type(code) is type(compiled.__code__) else None


def main(source: str) -> None:
    """Run the dispatcher in ``source`` as ``__main__`` (it exits), or ``--compile`` it.

    Only this function's code is compiled at every call (the launcher's size is part
    of a call's cost): writing the compiled file is the dispatcher's write_compiled."""
    script, args = sys.argv[0], sys.argv[1:]
    if not source:
        sys.stderr.write(f"{TAG}: no dispatcher in this file: write it with sshadapter\n")
        sys.exit(CANNOT_EXECUTE_STATUS)
    code = compiled(script, source, owners(args)) if args != [COMPILE_OPTION] else None
    if code is None:  # docstrings are never read: optimize=2 makes the code smaller to load
        code = compile(source, script, "exec", dont_inherit=True, optimize=2)
    if args == [COMPILE_OPTION]:
        namespace: dict[str, Any] = {
            "__name__": "sshadapter_dispatch",
            "__builtins__": __builtins__,
        }
        exec(code, namespace)  # noqa: S102 - the dispatcher's own definitions, nothing runs
        data = header(source) + marshal.dumps(code)
        sys.exit(namespace["write_compiled"](script + CODE_SUFFIX, data, compiled, source))
    exec(code, {"__name__": "__main__", "__file__": script, "__builtins__": __builtins__})  # noqa: S102


# `sshadapter dispatcher --write` puts the dispatcher's source here (policy.dispatcher_source).
SOURCE = ""

if __name__ == "__main__":
    main(SOURCE)
