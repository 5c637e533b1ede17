"""The state directory, the daemon's alone: :class:`StateLock` (``flock`` on the directory, held for the daemon's
life, its PID written beside it); the directory created 0700 and the ledger 0600; symbolic links refused.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from gpuwear.ledger.errors import LedgerError, StateLockedError

PID_FILE = "gpuwear.pid"


class StateLock:
    """An exclusive lock on a state directory: ``flock`` on the directory itself (possible even while it is
    read-only), held until :meth:`release` or the process ends (a kill -9 included: the kernel drops it). The
    holder's PID is written to ``gpuwear.pid`` beside the ledger where the directory allows, for the message a
    second process gets."""

    def __init__(self, folder: Path, fd: int) -> None:
        self.folder = folder
        self._fd = fd

    @classmethod
    def acquire(cls, folder: Path) -> StateLock:
        """Lock ``folder`` (created 0700 when missing). Raises :class:`StateLockedError` naming the holder, or
        OSError when the folder cannot be made or opened."""
        private_folder(folder)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_pid(folder / PID_FILE)
            raise StateLockedError(f"the state directory {folder} is locked by another gpuwear"
                                   + (f" (PID {holder})" if holder else "")
                                   + ": only one process may write its ledger (another daemon needs a state "
                                     "directory of its own: --state-dir DIR, or state_dir in its config)") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            pid_fd = os.open(folder / PID_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(pid_fd, "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError:  # a read-only directory: locked all the same, the holder just goes unnamed
            pass
        return cls(folder, fd)

    def release(self) -> None:
        if self._fd < 0:
            return
        try:
            if _read_pid(self.folder / PID_FILE) == os.getpid():
                (self.folder / PID_FILE).unlink()
        except OSError:
            pass
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = -1


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()[:32].strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def private_folder(folder: Path) -> None:
    """Create ``folder`` mode 0700 whatever the umask, refusing a symbolic link (but systemd's own: with
    ``DynamicUser=``, ``/var/lib/gpuwear`` is a link into ``/var/lib/private``)."""
    if folder.is_symlink() and not os.path.realpath(folder).startswith("/var/lib/private/"):
        raise LedgerError(f"the state directory {folder} is a symbolic link: refusing to follow it "
                          "(point state_dir at the real directory)")
    if not folder.is_dir():
        folder.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        return
    st = folder.stat()
    if st.st_mode & (stat.S_IWOTH | stat.S_ISVTX):  # /tmp, /var/tmp: other users' files live there
        raise LedgerError(f"{folder} is a shared directory (writable by everyone): give gpuwear a folder of its own "
                          "(state_dir, --state-dir), which it keeps private")
    if st.st_uid == os.geteuid() and st.st_mode & 0o077:
        os.chmod(folder, 0o700)


def _private_file(path: Path) -> None:
    """Create the ledger file mode 0600 (SQLite gives its -wal and -shm files the same mode), refusing links."""
    for candidate in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if candidate.is_symlink():
            raise LedgerError(f"{candidate} is a symbolic link: refusing to follow it")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
