"""Outputs never touch inputs: every output option of every command goes through :func:`check_outputs`
before any work.

An output is refused (``OutputError``, exit 2, one line naming the option, the path and the input)
when it resolves (symbolic links followed; ``os.path.realpath``) to a file the command reads, is the
same file as one (a hard link: same device and inode), lies inside an input read whole (an ingest
output directory, an Nsight SQLite export directory), or is named like a trace file (what
:func:`ep_trace.parsers.dispatch.detect_format` reads as a rank: ``*.json``, ``*.json.gz``,
``*.sqlite``, ``*.nsys-rep``, ``*.ep-events.parquet``, ``rank<r>.ep.jsonl``) inside an input
directory, where the next run on that directory would read it as a rank. A directory output (the
tables of ``ingest -o``, the traces of ``annotate -o``) is refused when it is an input directory, and
the files it writes are checked like file outputs. Two outputs naming one file are refused too.

Writes are atomic (``outputs.write_atomic``: a temporary file, then ``os.replace``), so even a missed
case replaces a directory entry rather than writing through it into an input's inode.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ep_trace.errors import EpTraceError, OutputError

__all__ = ["Output", "check_outputs", "check_writable", "check_name_lengths", "input_view", "InputView", "tmp_prefix"]


def tmp_prefix(p: Path) -> str:
    """Prefix of the temporary files beside ``p``: its name cut to 64 characters, so that a name near
    the file-system limit (255 bytes) still leaves room for the random part and the suffix."""
    return f".{p.name[:64]}."


def check_name_lengths(p: Path, existing: Path) -> None:
    """Raise ``OSError(ENAMETOOLONG)`` if a component of ``p`` below the existing directory ``existing``
    is longer than that file system allows: the OS says so only when the write reaches it (a missing
    parent is reported first), after the analysis."""
    try:
        limit = os.pathconf(existing, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for part in p.parts[len(existing.parts) if p.is_relative_to(existing) else 0 :]:
        if len(os.fsencode(part)) > limit:
            raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), str(p))


def check_writable(path: str | Path, option: str) -> Path:
    """Fail now, naming ``option``, if ``path`` cannot be written as a file later.

    The nearest existing ancestor directory (the write creates missing parents) is probed with a
    temporary file, which is removed again; nothing is created.

    Raises:
        OutputError: ``path`` is a directory, its parent is not a directory, or not writable.
    """
    p = Path(path)
    try:
        if p.is_dir():
            raise OutputError(f"{option} {p}: is a directory; pass a file name, e.g. {p / 'report.html'}")
        if p.exists() and not p.is_file():
            raise OutputError(f"{option} {p}: not a regular file; pass a file name in a writable directory")
        parent = p.parent
        while not parent.exists() and parent != parent.parent:  # the write creates missing parents
            parent = parent.parent
        if not parent.is_dir():
            raise OutputError(f"{option} {p}: {parent} is not a directory; choose a path in a writable directory")
        check_name_lengths(p, parent)
    except OSError as exc:  # ENAMETOOLONG, ELOOP, EACCES on a parent: what the OS says, on one line
        fix = "choose a shorter name" if exc.errno == errno.ENAMETOOLONG else "choose another path"
        raise OutputError(f"{option} {p}: {exc.strerror or exc}; {fix}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=tmp_prefix(p), suffix=".probe", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(
            f"{option} {p}: cannot write in {parent} ({exc.strerror or exc}); choose a writable directory"
        ) from None
    return p


@dataclass(frozen=True)
class Output:
    """One output of a command.

    Attributes:
        option: The option that names it (``-o``, ``--json``, ``--record``, ``--propose-placement``).
        path: What the user passed.
        directory: A directory the command writes files into (``ingest -o``, ``annotate -o``).
        writes: For a directory: the names it writes or replaces inside (one example name per pattern,
            e.g. ``rank0.ep-annotated.json.gz``; a sub-directory it clears, e.g. ``events``).
    """

    option: str
    path: Path
    directory: bool = False
    writes: tuple[str, ...] = ()


@dataclass(frozen=True)
class InputView:
    """What the commands' inputs are on disk (all paths resolved).

    Attributes:
        files: Every file read: the trace files and sidecars that discovery finds, files given directly.
        inodes: ``(st_dev, st_ino)`` of each of ``files`` -> the file (hard links).
        trees: Input directories (searched for traces): an output named like a trace inside is refused.
        whole: Inputs read whole (ingest outputs, Nsight export directories): nothing may be written inside.
        sidecar_dirs: Directories of single-file inputs: the file's sidecars ``rank<r>.ep.jsonl`` are read there.
    """

    files: frozenset[Path] = frozenset()
    inodes: dict[tuple[int, int], Path] = field(default_factory=dict)
    trees: tuple[Path, ...] = ()
    whole: tuple[Path, ...] = ()
    sidecar_dirs: tuple[Path, ...] = ()


def _resolve(p: Path, option: str) -> Path:
    try:
        return Path(os.path.realpath(p))
    except OSError as exc:  # a symlink loop, a name longer than the OS allows
        raise OutputError(f"{option} {p}: {exc.strerror or exc}; choose another path") from None


def _discovered(p: Path) -> tuple[list[Path], list[Path]]:
    """(files the loader reads under directory ``p``, sub-directories it reads whole); ``([], [])``
    where discovery refuses the directory (the run then fails on it before writing anything)."""
    from ep_trace.parsers.dispatch import discover

    try:
        inputs, sidecars = discover(p)
    except EpTraceError:
        return [], []
    files = [f for f, _ in inputs if not f.is_dir()] + list(sidecars.values())
    return files, [f for f, _ in inputs if f.is_dir()]


def input_view(inputs: Iterable[str | Path]) -> InputView:
    """The :class:`InputView` of the paths a command reads (trace directories or files, summaries)."""
    from ep_trace.parsers.parquet_read import is_ingest_dir

    files: list[Path] = []
    trees: list[Path] = []
    whole: list[Path] = []
    side: list[Path] = []
    for raw in inputs:
        p = Path(raw)
        try:
            if p.is_dir():
                if is_ingest_dir(p):
                    whole.append(p)
                    continue
                found, dirs = _discovered(p)
                trees.append(p)
                files += found
                whole += dirs
            elif p.exists():
                files.append(p)
                side.append(p.parent)
        except OSError:
            continue  # an input the OS refuses: the run fails on it, naming it, before writing
    resolved = frozenset(Path(os.path.realpath(f)) for f in files)
    inodes: dict[tuple[int, int], Path] = {}
    for f in resolved:
        try:
            st = f.stat()
        except OSError:
            continue
        inodes[(st.st_dev, st.st_ino)] = f

    def real(ps: list[Path]) -> tuple[Path, ...]:
        return tuple(dict.fromkeys(Path(os.path.realpath(x)) for x in ps))

    return InputView(resolved, inodes, real(trees), real(whole), real(side))


_KINDS = {"kineto": "Kineto trace", "nsys": "Nsight export", "cupti": "CUPTI events file", "sidecar": "sidecar"}


def _trace_format(p: Path) -> str | None:
    """The format dispatch would read ``p`` as (by name), or None."""
    from ep_trace.parsers.dispatch import detect_format

    try:
        return detect_format(p)
    except OSError:
        return None


def _read_by_discovery(rp: Path, tree: Path) -> bool:
    """``rp`` lies under ``tree`` on a path discovery walks (no hidden component)."""
    try:
        rel = rp.relative_to(tree)
    except ValueError:
        return False
    return not any(part.startswith(".") for part in rel.parts)


def _check_file(option: str, p: Path | str, rp: Path, view: InputView) -> None:
    """Refuse the output ``p`` (shown as given) that resolves to ``rp`` if it touches an input."""
    if rp in view.files:
        raise OutputError(
            f"{option} {p}: is the input file {rp}; writing it would destroy the input: choose another path"
        )
    try:
        st = os.stat(rp)
    except OSError:
        st = None
    if st is not None and (st.st_dev, st.st_ino) in view.inodes:
        f = view.inodes[(st.st_dev, st.st_ino)]
        raise OutputError(
            f"{option} {p}: is the same file as the input {f} (a hard link); writing it would destroy the input: "
            "choose another path"
        )
    for d in view.whole:
        if rp == d or rp.is_relative_to(d):
            raise OutputError(
                f"{option} {p}: is inside the input {d}, which is read whole (an ingest output or an Nsight "
                "export directory); choose a path outside it"
            )
    fmt = _trace_format(rp)
    if fmt is None:
        return
    homes = [d for d in view.trees if _read_by_discovery(rp, d)]
    if fmt == "sidecar":
        homes += [d for d in view.sidecar_dirs if rp.parent == d]
    if homes:
        kind = _KINDS.get(fmt, f"{fmt} file")
        raise OutputError(
            f"{option} {p}: is named like a {kind} inside the input directory {homes[0]}: the next run on it "
            "would read it as a rank; choose another name or directory"
        )


def _check_dir(out: Output, view: InputView) -> Path:
    p = out.path
    try:
        if p.exists() and not p.is_dir():
            raise OutputError(f"{out.option} {p}: exists and is not a directory; pass a directory")
        existing = p
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        check_name_lengths(p, existing)
    except OSError as exc:
        raise OutputError(f"{out.option} {p}: {exc.strerror or exc}; choose another directory") from None
    rd = _resolve(p, out.option)
    if rd in view.files or (out.writes and (rd in view.trees or rd in view.whole)):
        raise OutputError(
            f"{out.option} {p}: is an input directory; what is written there would change the input of the "
            "next run: choose another directory"
        )
    for name in out.writes:
        target = rd / name
        for f in view.files:
            if f == target or f.is_relative_to(target):
                raise OutputError(
                    f"{out.option} {p}: writing {target} would replace the input {f}; choose another directory"
                )
        _check_file(out.option, f"{p} (its {name})", target, view)
    return rd


def check_outputs(inputs: Sequence[str | Path], *outputs: Output | None) -> None:
    """Refuse, before any work, an output that would overwrite or join the inputs (see the module doc),
    that cannot be written, or two outputs naming one file.

    Args:
        inputs: The paths the command reads (trace directories or files, summary JSONs, a --stages file).
        outputs: The command's outputs; ``None`` entries (options not given) are skipped.

    Raises:
        OutputError: one line naming the option, the path and why.
    """
    given = [o for o in outputs if o is not None]
    if not given:
        return
    view = input_view(inputs)
    seen: dict[Path, str] = {}
    for out in given:
        if out.directory:
            rp = _check_dir(out, view)
        else:
            check_writable(out.path, out.option)
            rp = _resolve(out.path, out.option)
            _check_file(out.option, out.path, rp, view)
        if rp in seen:
            raise OutputError(f"{out.option} {out.path}: same path as {seen[rp]}; pass different paths")
        seen[rp] = out.option
