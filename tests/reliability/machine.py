"""A simulated machine crash on local disk: what survives is what was fsynced, nothing more.

``kill -9`` and ``os._exit`` keep everything the process wrote (the kernel's page cache
outlives it), so they cannot tell a missing ``fsync`` from a present one. A machine crash (power
loss, kernel panic) can: file data not fsynced is lost, and so is a directory entry (a created,
linked, renamed or removed name) whose directory was not fsynced after the change.

:func:`install` patches ``os.open``, ``os.mkdir`` and ``os.fsync`` in the calling process (all
its threads; call it in each process that writes under ``root``, before it writes) so that each
durable point is recorded in a *shadow* directory shared by all the processes of one "machine":

- ``fsync`` of a regular file: its current content, keyed by its inode;
- ``fsync`` of a directory: its current entries (name -> inode, file or directory);
- ``open`` with ``O_CREAT`` of a new file, ``mkdir``: its inode holds nothing durable yet (an
  inode number may be reused after a file was removed: its old content must not come back under
  a new name).

:func:`baseline` records a whole tree as durable (what existed before the writers started).
:func:`crash` rebuilds ``root`` from the shadow: starting at ``root`` (taken as durable), each
directory holds the entries of its last fsync (or of the baseline), each file the content of its
inode's last fsync, or nothing (zero length, what ext4 and XFS show for data that never reached
the disk) when it was never fsynced. Subtrees named in ``keep`` are left as they are (written by
processes that do not record, e.g. a Spark executor).

This is the strictest crash POSIX allows; real filesystems often keep more (ext4's ordered mode
writes a new file's data before the entry that names it), so a write path that survives this
survives them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import stat
import threading
from collections.abc import Iterable, Iterator
from typing import Any

_real_open = os.open
_real_fsync = os.fsync
_real_mkdir = os.mkdir
_installed: dict[str, Any] = {}
_thread_lock = threading.Lock()


class _Shadow:
    """The durable state of one machine's disk, shared by its processes (flock-serialised).

    Inode numbers are reused once a file is removed, but on a real disk not before the removal
    is durable: each creation starts a new *generation* of its inode number, and listings and
    contents are kept per generation."""

    def __init__(self, path: str) -> None:
        self.path = path
        for sub in ("inodes", "dirs", "gens"):
            os.makedirs(os.path.join(path, sub), exist_ok=True)
        self._lock_path = os.path.join(path, "lock")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        # Two processes fsyncing one directory must record their listings in the order the
        # fsyncs happened, or an older listing would overwrite a newer one.
        with _thread_lock:
            fd = _real_open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock (also when the process is killed)

    def _write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def _read(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def generation(self, ino: int) -> int:
        raw = self._read(os.path.join(self.path, "gens", str(ino)))
        return 0 if raw is None else int(raw)

    def created(self, ino: int) -> None:
        """A new file or directory took inode number ``ino``: nothing of it is durable yet."""
        self._write(os.path.join(self.path, "gens", str(ino)), b"%d" % (self.generation(ino) + 1))

    def file_synced(self, ino: int, data: bytes) -> None:
        self._write(os.path.join(self.path, "inodes", f"{ino}.{self.generation(ino)}"), data)

    def dir_synced(self, ino: int, directory: str) -> None:
        entries: dict[str, list[Any]] = {}
        with os.scandir(directory) as it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # removed since the listing (a temporary file after its link)
                kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
                entries[entry.name] = [kind, st.st_ino, self.generation(st.st_ino)]
        path = os.path.join(self.path, "dirs", f"{ino}.{self.generation(ino)}.json")
        self._write(path, json.dumps(entries).encode())

    def durable_entries(self, ino: int, gen: int) -> dict[str, list[Any]]:
        raw = self._read(os.path.join(self.path, "dirs", f"{ino}.{gen}.json"))
        return {} if raw is None else dict(json.loads(raw))

    def durable_content(self, ino: int, gen: int) -> bytes:
        return self._read(os.path.join(self.path, "inodes", f"{ino}.{gen}")) or b""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def install(root: str, shadow: str) -> None:
    """Record, in this process, every durable point of writes under ``root`` into ``shadow``."""
    root = os.path.realpath(root)
    if _installed:
        raise RuntimeError(f"machine-crash recording is already installed for {_installed['root']}")
    sh = _Shadow(shadow)

    def recording_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: Any = None) -> int:
        fd = _real_open(path, flags, mode, dir_fd=dir_fd)
        if flags & os.O_CREAT and dir_fd is None:
            full = os.path.realpath(os.fspath(path))
            if _under(full, root):
                st = os.fstat(fd)
                # O_EXCL: a new inode. Without it the file may have existed; its durable
                # content stays whatever was last fsynced either way, except for a new inode.
                if flags & os.O_EXCL or st.st_size == 0:
                    with sh.locked():
                        sh.created(st.st_ino)
        return fd

    def recording_fsync(fd: Any) -> None:
        _real_fsync(fd)
        fileno = fd if isinstance(fd, int) else fd.fileno()
        try:
            path = os.readlink(f"/proc/self/fd/{fileno}")
        except OSError:
            return
        if not _under(path, root):
            return
        st = os.fstat(fileno)
        with sh.locked():
            if stat.S_ISDIR(st.st_mode):
                sh.dir_synced(st.st_ino, path)
            elif stat.S_ISREG(st.st_mode):
                with open(f"/proc/self/fd/{fileno}", "rb") as f:  # the fd may be write-only
                    sh.file_synced(st.st_ino, f.read())

    def recording_mkdir(path: Any, mode: int = 0o777, *, dir_fd: Any = None) -> None:
        _real_mkdir(path, mode, dir_fd=dir_fd)
        if dir_fd is None and _under(os.path.realpath(os.fspath(path)), root):
            with sh.locked():
                sh.created(os.stat(path).st_ino)  # a new directory lists nothing durable

    os.open = recording_open
    os.fsync = recording_fsync
    os.mkdir = recording_mkdir
    _installed.update(root=root, shadow=shadow)


def uninstall() -> None:
    """Stop recording in this process."""
    os.open = _real_open
    os.fsync = _real_fsync
    os.mkdir = _real_mkdir
    _installed.clear()


def baseline(root: str, shadow: str) -> None:
    """Record the whole tree under ``root`` as durable, as if everything had been fsynced."""
    sh = _Shadow(shadow)
    with sh.locked():
        for directory, _, files in os.walk(root):
            sh.dir_synced(os.stat(directory).st_ino, directory)
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    sh.file_synced(os.stat(path).st_ino, f.read())


@contextlib.contextmanager
def recording(root: str, shadow: str) -> Iterator[None]:
    """:func:`baseline` then :func:`install` for the duration of a ``with`` block."""
    baseline(root, shadow)
    install(root, shadow)
    try:
        yield
    finally:
        uninstall()


def crash(root: str, shadow: str, *, keep: Iterable[str] = ()) -> dict[str, int]:
    """Replace ``root`` with what a machine crash leaves of it (the module docstring); the
    relative paths in ``keep`` are carried over as they are. Returns counts: ``files`` (files
    rebuilt), ``emptied`` (of them, those whose data was never fsynced), ``gone`` (names under
    ``root`` before the crash that it lost)."""
    root = os.path.realpath(root)
    sh = _Shadow(shadow)
    counts = {"files": 0, "emptied": 0, "gone": 0}
    rebuilt = root + ".crashed"
    shutil.rmtree(rebuilt, ignore_errors=True)
    kept = {os.path.normpath(k) for k in keep}

    def rebuild(ino: int, gen: int, rel: str) -> None:
        dst = os.path.normpath(os.path.join(rebuilt, rel))
        os.makedirs(dst, exist_ok=True)
        entries = sh.durable_entries(ino, gen)
        for name, (kind, entry_ino, entry_gen) in sorted(entries.items()):
            child = os.path.normpath(os.path.join(rel, name))
            if child in kept:
                continue
            if kind == "dir":
                rebuild(int(entry_ino), int(entry_gen), child)
                continue
            data = sh.durable_content(int(entry_ino), int(entry_gen))
            counts["emptied"] += not data
            counts["files"] += 1
            with open(os.path.join(dst, name), "wb") as f:
                f.write(data)

    with sh.locked():
        st = os.stat(root)
        rebuild(st.st_ino, sh.generation(st.st_ino), ".")
    for rel in sorted(kept):
        src, dst = os.path.join(root, rel), os.path.join(rebuilt, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isdir(src):
            shutil.copytree(src, dst)
        elif os.path.exists(src):
            shutil.copy2(src, dst)
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            rel = os.path.relpath(os.path.join(directory, name), root)
            counts["gone"] += not os.path.lexists(os.path.join(rebuilt, rel))
    shutil.rmtree(root)
    os.rename(rebuilt, root)
    return counts
