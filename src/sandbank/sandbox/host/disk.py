"""Workspace disks: a loop-mounted ext4 image per sandbox, so a full disk is ENOSPC, not OOM.

Each image is allocated whole on the data directory's file system when it is made
(`allocate`: unwritten extents, under a millisecond per GiB), never sparse: a session's writes
never need the host's free space, so one tenant filling its workspace can neither fill the
host's file system nor make another session's write fail after it was acknowledged. A new
image is refused while it would leave less than the reserve free for the database, objects
and logs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from pathlib import Path

from ...errors import DiskReserved, IsolationUnavailable, SandboxError

MiB = 1 << 20
_ALLOCATING = threading.Lock()  # one admission decision at a time in this server

MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


def _run(argv: list[str]) -> None:
    try:
        proc = subprocess.run(argv, env=_ENV, capture_output=True, timeout=60, check=False)
    except FileNotFoundError as e:
        raise IsolationUnavailable(
            f"{argv[0]} is missing: install Debian's e2fsprogs and mount packages"
        ) from e
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise SandboxError(f"{argv[0]} failed: {err}")


def allocate(image: Path, size_bytes: int, keep_free: int) -> None:
    """Make `image` a file of `size_bytes` allocated whole, if the file system keeps
    `keep_free` bytes free beside it; `DiskReserved` (and no file) otherwise."""
    with _ALLOCATING:
        fs = os.statvfs(image.parent)
        free = fs.f_bavail * fs.f_frsize
        if free - size_bytes < keep_free:
            raise DiskReserved(_no_room(size_bytes, free, keep_free), retry_after=30)
        fd = os.open(image, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as e:
            os.close(fd)
            image.unlink(missing_ok=True)
            if e.errno == errno.ENOSPC:
                raise DiskReserved(_no_room(size_bytes, free, keep_free), retry_after=30) from None
            raise
        os.close(fd)


def _no_room(size: int, free: int, keep_free: int) -> str:
    return (
        f"the server's disk has no room for another workspace of {size // MiB} MiB: "
        f"{free // MiB} MiB free, {keep_free // MiB} MiB of it kept for the server's own data "
        "(SANDBANK_DISK_RESERVE_MB); retry later"
    )


def create(image: Path, mountpoint: Path, size_bytes: int, uid: int, keep_free: int) -> None:
    """Make an ext4 image owned by `uid`, allocated whole, and mount it (nosuid, nodev) at
    `mountpoint`."""
    allocate(image, size_bytes, keep_free)
    _run(
        [
            "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
            "-E", f"root_owner={uid}:{uid},nodiscard", str(image),
        ]
    )  # fmt: skip
    mountpoint.mkdir(parents=True, exist_ok=True)
    _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)])
    with contextlib.suppress(OSError):
        (mountpoint / "lost+found").rmdir()
    os.chmod(mountpoint, 0o700)


def destroy(image: Path, mountpoint: Path) -> None:
    """Unmount and delete; a busy mount (a file still open on it) is detached lazily."""
    if is_mounted(mountpoint):
        unmount(str(mountpoint), lazy=True)
    with contextlib.suppress(FileNotFoundError):
        image.unlink()


def is_mounted(path: Path) -> bool:
    """Whether a file system of its own is mounted at `path`.

    A stat, not a read of the mount table: the sandboxes' disks (loop-mounted ext4) and egress
    directories (tmpfs) are each a device of their own, and the table grows with the sandboxes
    (~4 ms to read and parse with 2,000 of them, for every sandbox given back). A bind mount
    from the same file system is not seen: use `mounts_under` for those.
    """
    return os.path.ismount(path)


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below `prefix`, from /proc/self/mountinfo."""
    base = str(prefix).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == base or point.startswith(base + "/"):
                found.append(point)
    return found


def unmount(point: str, lazy: bool = False) -> None:
    """Unmount `point`; with `lazy`, detach it even while busy (freed when the last file closes)."""
    try:
        _run(["umount", point])
    except SandboxError:
        if not lazy:
            raise
        _run(["umount", "--lazy", point])


def mount_image(image: Path, point: Path) -> None:
    """Loop-mount an ext4 image read-only (nosuid, nodev) at `point`."""
    _run(["mount", "-o", "loop,ro,nosuid,nodev", str(image), str(point)])


def mount_tmpfs(point: Path, size_bytes: int, *, noexec: bool = False) -> None:
    """A fresh tmpfs (nosuid, nodev) of at most `size_bytes` at `point`: one system call."""
    flags = MS_NOSUID | MS_NODEV | (MS_NOEXEC if noexec else 0)
    sys_mount("sandbank", point, "tmpfs", flags, f"size={size_bytes},mode=755")


def remount_readonly(point: Path) -> None:
    _run(["mount", "-o", "remount,ro,nosuid,nodev", str(point)])


# --- the fast path: a copy of a formatted image, attached and mounted without a subprocess ---

LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4  # the loop device detaches itself once unmounted
_LOOP_INFO64_SIZE = 232
_LO_FLAGS_OFFSET = 52  # of lo_flags in struct loop_info64
_ATTACH_TRIES = 32


def format_image(image: Path, size_bytes: int) -> None:
    """A formatted, empty ext4 image that `create_from` copies (a few hundred KiB allocated)."""
    with open(image, "wb") as f:
        f.truncate(size_bytes)
    _run(
        [
            "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
            "-E", "root_owner=0:0,nodiscard", str(image),
        ]
    )  # fmt: skip


def create_from(formatted: Path, image: Path, mountpoint: Path, uid: int, keep_free: int) -> None:
    """What `create` does, from a copy of `formatted`: ~1 ms of copying instead of mkfs."""
    allocate(image, os.stat(formatted).st_size, keep_free)
    _copy_sparse(formatted, image)
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        _attach_and_mount(image, mountpoint)
    except OSError:
        # An older kernel (no LOOP_CONFIGURE) or no /dev/loop-control: mount(8) knows more.
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)])
    with contextlib.suppress(OSError):
        (mountpoint / "lost+found").rmdir()
    os.chown(mountpoint, uid, uid)
    os.chmod(mountpoint, 0o700)


def _copy_sparse(src: Path, dst: Path) -> None:
    """Copy `src`'s data into `dst` (allocated already, as large), leaving its holes zero."""
    with open(src, "rb") as fi, open(dst, "r+b") as fo:
        pos = 0
        while True:
            try:
                start = os.lseek(fi.fileno(), pos, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past pos
                return
            end = os.lseek(fi.fileno(), start, os.SEEK_HOLE)
            off = start
            while off < end:
                n = os.copy_file_range(fi.fileno(), fo.fileno(), end - off, off, off)
                if n == 0:
                    raise SandboxError(f"copying {src} stopped short")
                off += n
            pos = end


def sys_mount(
    source: str | None, target: Path, fstype: str | None, flags: int, data: str | None = None
) -> None:
    """mount(2) itself: no subprocess, and flags (such as MS_REMOUNT) mount(8) would rewrite."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]

    def c(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    if libc.mount(c(source), str(target).encode(), c(fstype), flags, c(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


def _attach_and_mount(image: Path, mountpoint: Path) -> None:
    import fcntl
    import struct

    info = bytearray(_LOOP_INFO64_SIZE)
    struct.pack_into("I", info, _LO_FLAGS_OFFSET, LO_FLAGS_AUTOCLEAR)
    ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(_ATTACH_TRIES):  # another process may take the free device first
            n = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
            loop = os.open(f"/dev/loop{n}", os.O_RDWR | os.O_CLOEXEC)
            try:
                config = struct.pack("II", backing, 0) + bytes(info) + bytes(64)
                try:
                    fcntl.ioctl(loop, LOOP_CONFIGURE, config)
                except OSError as e:
                    if e.errno == errno.EBUSY:
                        continue
                    raise
                sys_mount(f"/dev/loop{n}", mountpoint, "ext4", MS_NOSUID | MS_NODEV)
                return
            finally:
                os.close(loop)  # with AUTOCLEAR, the mount now holds the device
        raise OSError(errno.EBUSY, "no free loop device")
    finally:
        os.close(backing)
        os.close(ctl)


# --- kept disks: a paused session's workspace, trimmed, kept, mounted again -----------------

FITRIM = 0xC0185879  # _IOWR('X', 121, struct fstrim_range)
FIFREEZE, FITHAW = 0xC0045877, 0xC0045878  # _IOWR('X', 119 / 120, int)


def trim(mountpoint: Path) -> None:
    """Give the file system's free blocks back to the image (the loop device punches holes), so
    a kept disk costs what its files hold, not its size."""
    import fcntl
    import struct

    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, FITRIM, bytearray(struct.pack("QQQ", 0, 2**64 - 1, 0)))
    except OSError:
        pass  # a file system or device without discard: the disk stays larger, nothing breaks
    finally:
        os.close(fd)


def keep(image: Path, mountpoint: Path, dest: Path) -> None:
    """Unmount a workspace whose processes are all dead and keep its image at `dest`, on disk."""
    trim(mountpoint)
    unmount(str(mountpoint))  # not lazily: a busy disk must not be kept half-written
    with open(image, "rb+") as f:
        dig_holes(f.fileno())
        os.fsync(f.fileno())
    if image != dest:
        try:
            os.rename(image, dest)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            _run(["cp", "--sparse=always", str(image), str(dest)])
            image.unlink()
    fsync_dir(dest.parent)


def frozen_copy(image: Path, mountpoint: Path, dest: Path) -> None:
    """Copy a mounted workspace's image consistently: its file system frozen meanwhile."""
    import fcntl

    tmp = dest.with_name(f".{dest.name}.tmp")
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        trim(mountpoint)
        fcntl.ioctl(fd, FIFREEZE, 0)
        try:
            with open(tmp, "wb") as f:
                f.truncate(os.stat(image).st_size)
            _copy_sparse(image, tmp)
        finally:
            fcntl.ioctl(fd, FITHAW, 0)
        with open(tmp, "rb+") as f:
            dig_holes(f.fileno())
            os.fsync(f.fileno())
        os.rename(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)


def remount_kept(
    image: Path, mountpoint: Path, uid: int, previous_uid: int, keep_free: int
) -> None:
    """Mount a kept image again for a sandbox of `uid`: allocated whole again (a paused disk
    is trimmed), its files given from `previous_uid` to `uid`."""
    with _ALLOCATING:
        st = os.stat(image)
        missing = st.st_size - st.st_blocks * 512
        fs = os.statvfs(image.parent)
        free = fs.f_bavail * fs.f_frsize
        if free - missing < keep_free:
            raise DiskReserved(_no_room(st.st_size, free, keep_free), retry_after=30)
        fd = os.open(image, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.posix_fallocate(fd, 0, st.st_size)
        except OSError as e:
            if e.errno == errno.ENOSPC:
                raise DiskReserved(_no_room(st.st_size, free, keep_free), retry_after=30) from None
            raise
        finally:
            os.close(fd)
    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        _attach_and_mount(image, mountpoint)
    except OSError:
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)])
    give_files(mountpoint, previous_uid, uid)
    os.chown(mountpoint, uid, uid)
    os.chmod(mountpoint, 0o700)


def give_files(root: Path, old: int, new: int) -> None:
    """The sandbox's entries (`old`'s, or any sandbox uid's: every one not the server's own)
    become `new`'s; links are changed, never followed. Runs while no process of the sandbox
    lives, so nothing swaps a name meanwhile."""
    del old  # a resume that failed midway may have left them to the uid it had
    for _top, dirs, names, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in dirs + names:
            with contextlib.suppress(OSError):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if st.st_uid not in (0, new):
                    gid = new if st.st_gid != 0 else 0
                    os.chown(name, new, gid, dir_fd=dir_fd, follow_symlinks=False)


FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
_HOLE_BLOCK = 64 << 10


def dig_holes(fd: int) -> None:
    """Punch out the zero blocks of an image's data (the file system's never-used inode tables,
    say): a kept disk then costs about what its files hold."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    zero = bytes(_HOLE_BLOCK)
    pos = 0
    while True:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past pos
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        off = start - start % _HOLE_BLOCK
        while off < end:
            block = os.pread(fd, _HOLE_BLOCK, off)
            if block == zero[: len(block)] and block:
                mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
                if libc.fallocate(fd, mode, off, len(block)) != 0:
                    return  # a file system without hole punching: the disk stays larger
            off += _HOLE_BLOCK
        pos = end


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, a new file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
