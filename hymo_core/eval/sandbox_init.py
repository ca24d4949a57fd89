"""The sandbox's launcher: builds the namespaces, the filesystem view and the unprivileged user a program runs as.

Run by `hymo_core.eval.sandbox` as a script (``python -I -S sandbox_init.py CONFIG``), so it imports
nothing of HyMo. The program's source arrives on stdin; fd ``CONFIG["status_fd"]`` reports
``pid N`` (the host pid of the namespace's init) and ``exec`` (set-up finished) to the caller.

Steps, all failing closed (exit 125 with one line on stderr):

0. Where the caller made one, join the cgroup v2 that bounds the program's memory and processes as a whole.
1. A helper forked before ``unshare`` writes the uid/gid maps when the launcher is root (the
   sandbox's uid 1000 is host uid 65534, never host root); an unprivileged launcher maps its own uid.
2. ``unshare`` user, mount, network, PID, IPC and UTS namespaces; fork the PID namespace's init,
   which dies with the launcher (``PR_SET_PDEATHSIG``). When init exits, the kernel kills every
   process left in the namespace, ``setsid`` or not.
3. A new root: a tmpfs holding read-only binds of ``/usr`` (and the interpreter's prefix),
   ``/dev/null`` and friends, a fresh ``/proc`` of the new PID namespace, and a private ``/tmp``
   tmpfs of bounded size and inode count (the total bytes a program can write). ``pivot_root``
   detaches the host tree, so no host path (``/work``, ``/root``, the host's ``/proc``) is reachable.
4. Drop to uid/gid 1000, no supplementary groups, no capabilities (bounding set emptied),
   ``no_new_privs``; rlimits on CPU, memory, file size, processes, open files; exec the program.
"""
from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
MNT_DETACH = 0x2
AT_FDCWD, AT_RECURSIVE = -100, 0x8000
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 1, 24, 38, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126, "mount_setattr": 442},
            "aarch64": {"pivot_root": 41, "capset": 91, "mount_setattr": 442}}
SANDBOX_ID = 1000  # the uid and gid the program has inside
HOST_NOBODY = 65534  # the host uid/gid it has outside when the launcher is root
SETUP_FAILED = 125
DEVICES = ("null", "zero", "full", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)}")
    return result


def _syscall(name: str, *args) -> int:
    numbers = SYSCALLS.get(platform.machine())
    if numbers is None:
        raise SetupError(f"no syscall table for {platform.machine()}")
    return libc.syscall(ctypes.c_long(numbers[name]), *args)


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encoded = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    _check(libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]), f"mount {target}")


def _read_only(target: str, recursive: bool = True) -> None:
    attr = MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    _check(_syscall("mount_setattr", ctypes.c_int(AT_FDCWD), target.encode(), ctypes.c_uint(flags),
                    ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr))), f"read-only {target}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)


def _maps_by_helper() -> tuple[int, int]:
    """Fork a helper (still in the host namespaces, still root) that maps uid/gid 1000 to host nobody.

    Returns (the fd that tells it the namespace exists, its pid).
    """
    ready_r, ready_w = os.pipe()
    parent = os.getpid()
    helper = os.fork()
    if helper == 0:
        os.close(ready_w)
        os.read(ready_r, 1)
        try:
            _write(f"/proc/{parent}/uid_map", f"{SANDBOX_ID} {HOST_NOBODY} 1\n")
            _write(f"/proc/{parent}/gid_map", f"{SANDBOX_ID} {HOST_NOBODY} 1\n")
            os._exit(0)
        except OSError as exc:
            print(f"hymo sandbox: writing the id maps: {exc}", file=sys.stderr)
            os._exit(1)
    os.close(ready_r)
    return ready_w, helper


def enter_namespaces() -> None:
    privileged = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    if privileged:
        ready_w, helper = _maps_by_helper()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    if privileged:
        os.write(ready_w, b"x")
        os.close(ready_w)
        _, status = os.waitpid(helper, 0)
        if status != 0:
            raise SetupError("the id-map helper failed")
    else:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{SANDBOX_ID} {uid} 1\n")
        _write("/proc/self/gid_map", f"{SANDBOX_ID} {gid} 1\n")


def _mkdirs(path: str) -> None:
    os.makedirs(path, mode=0o755, exist_ok=True)


def open_binds(paths: list[str]) -> list[tuple[str, str, int | None]]:
    """(path, kind, O_PATH fd) per bind, opened while the launcher is still the host user: once it is
    uid 1000 it may not traverse to them (the interpreter may live under a 0700 /root)."""
    opened = []
    for path in paths:
        if os.path.islink(path):
            opened.append((path, "link", None))
        elif os.path.exists(path):
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            opened.append((path, "dir" if os.path.isdir(path) else "file", fd))
    return opened


def build_root(binds: list[tuple[str, str, int | None]], tmp_bytes: int, tmp_inodes: int, program: bytes) -> None:
    """The filesystem view (step 3); afterwards / is the new root and the host tree is detached."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for name in ("newroot", "oldroot"):
        _mkdirs(f"/tmp/{name}")
    _mount("/tmp/newroot", "/tmp/newroot", None, MS_BIND)
    os.chdir("/tmp")
    _check(_syscall("pivot_root", b".", b"oldroot"), "pivot_root into the staging tmpfs")
    os.chdir("/")
    for path, kind, fd in binds:
        target = "/newroot" + path
        _mkdirs(os.path.dirname(target))
        if kind == "link":
            os.symlink(os.readlink("/oldroot" + path), target)
            continue
        if kind == "dir":
            _mkdirs(target)
        else:
            open(target, "w").close()
        _mount(f"/oldroot/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
        _read_only(target, recursive=kind == "dir")
        os.close(fd)
    _mkdirs("/newroot/dev")
    for name in DEVICES:
        open(f"/newroot/dev/{name}", "w").close()
        _mount(f"/oldroot/dev/{name}", f"/newroot/dev/{name}", None, MS_BIND)
    _mkdirs("/newroot/proc")
    _mount("proc", "/newroot/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mkdirs("/newroot/tmp")
    _mount("tmpfs", "/newroot/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmp_bytes},nr_inodes={tmp_inodes},mode=1777")
    with open("/newroot/tmp/program.py", "wb") as handle:
        handle.write(program)
    os.chmod("/newroot/tmp/program.py", 0o644)
    os.chdir("/newroot")
    _check(_syscall("pivot_root", b".", b"."), "pivot_root into the new root")
    _check(libc.umount2(b".", MNT_DETACH), "detaching the host tree")
    os.chdir("/")
    _read_only("/", recursive=False)
    os.chdir("/tmp")


def become_sandbox_user() -> None:
    """uid/gid 1000 and no groups, keeping the namespace's capabilities for the mounts: files the
    launcher creates need an owner mapped into the namespace (host root is not)."""
    try:
        os.setgroups([])
    except PermissionError:  # an unprivileged launcher's setgroups is denied; its groups are unmapped
        pass
    os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)


def drop_privileges(limits: dict[str, int]) -> None:
    """No capabilities (bounding set emptied), no_new_privs, rlimits (step 4)."""
    for capability in range(64):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) < 0:
            break  # past the last capability this kernel knows
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()
    _check(_syscall("capset", ctypes.byref(header), ctypes.byref(data)), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value))


def join_cgroup(path: str | None) -> None:
    """Step 0, while still host root: move the launcher (so every process it starts) into the program's cgroup."""
    if path:
        _write(os.path.join(path, "cgroup.procs"), "0")


def main() -> None:
    config = json.loads(sys.argv[1])
    try:
        join_cgroup(config.get("cgroup"))
    except OSError as exc:
        print(f"hymo sandbox: joining the memory cgroup: {exc}", file=sys.stderr)
        sys.exit(SETUP_FAILED)
    status = os.fdopen(config["status_fd"], "w", buffering=1)
    program = sys.stdin.buffer.read()
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        enter_namespaces()
    except (SetupError, OSError) as exc:
        print(f"hymo sandbox: {exc}", file=sys.stderr)
        sys.exit(SETUP_FAILED)
    alive_r, alive_w = os.pipe()  # EOF on alive_r: the launcher is gone (getppid() is 0 across a PID namespace)
    init = os.fork()
    if init == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            os.close(alive_w)
            if select.select([alive_r], [], [], 0)[0]:
                os._exit(SETUP_FAILED)  # the launcher died before PDEATHSIG was armed
            os.close(alive_r)
            binds = open_binds(config["binds"])
            become_sandbox_user()
            build_root(binds, config["tmp_bytes"], config["tmp_inodes"], program)
            drop_privileges(config["limits"])
            status.write("exec\n")
            status.close()
            os.execve(config["python"], [config["python"], "-I", "-S", "program.py"], config["env"])
        except (SetupError, OSError) as exc:
            print(f"hymo sandbox: {exc}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    os.close(alive_r)
    status.write(f"pid {init}\n")
    status.close()
    _, code = os.waitpid(init, 0)
    sys.exit(os.waitstatus_to_exitcode(code) if os.WIFEXITED(code) else 128 + os.WTERMSIG(code))


if __name__ == "__main__":
    main()
