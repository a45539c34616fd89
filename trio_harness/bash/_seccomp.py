"""The sandbox's seccomp filter: a classic BPF program assembled here, handed to ``bwrap --seccomp FD``.

The filter (docs/sandbox.rst, "Threat model") checks the architecture first:
only the machine's own 64-bit system call table is allowed (x86_64 or
aarch64); a foreign architecture (i386 through ``int 0x80``, 32-bit ARM) and
x86_64's x32 numbers kill the process, because their numbering would slip
past the rules below.  Then, for every command:

* the mount family (``mount``, ``umount2``, ``pivot_root``, ``open_tree``,
  ``open_tree_attr``, ``move_mount``, ``fsopen``, ``fsconfig``, ``fsmount``,
  ``fspick``, ``mount_setattr``) and ``setns`` fail with EPERM;
* a new user namespace (``unshare`` or ``clone`` with ``CLONE_NEWUSER``)
  fails with EPERM; ``clone3``, whose flags sit in memory a filter cannot
  read, fails with ENOSYS, so C libraries fall back to ``clone``;
* ``io_uring_setup`` / ``io_uring_enter`` / ``io_uring_register`` fail with
  EPERM (io_uring performs socket and file operations no filter sees);
* the kernel keyring (``keyctl``, ``add_key``, ``request_key``) fails with
  EPERM (keyrings are per user, not per namespace);
* ``ioctl`` ``TIOCSTI`` and ``TIOCLINUX`` (typing into a terminal) fail with EPERM.

Unless unix sockets are allowed, also: ``socket(AF_UNIX, ...)`` fails with
EPERM, and so does ``socketpair(AF_UNIX, SOCK_DGRAM, ...)`` (a datagram
socket can be pointed at any socket file with ``connect`` or ``sendto``);
``socketpair`` of stream and seqpacket sockets stays allowed (its sockets are
connected to each other and cannot be connected elsewhere).

A filter cannot read memory, so it cannot see the path a ``connect`` names:
it refuses unix sockets altogether or not at all.
"""

from __future__ import annotations

import errno
import platform
import struct

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_AND_K = 0x54
_RET_K = 0x06
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000
_AUDIT_ARCH_X86_64 = 0xC000003E
_AUDIT_ARCH_AARCH64 = 0xC00000B7
_X32_SYSCALL_BIT = 0x40000000
# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR = 0
_ARCH = 4


def _arg(index: int) -> int:
    """Offset of the low 32 bits of argument ``index`` (both supported machines are little-endian)."""
    return 16 + 8 * index


_CLONE_NEWUSER = 0x10000000
_AF_UNIX = 1
_SOCK_DGRAM = 2
_SOCK_TYPE_MASK = 0xF
_TIOCSTI = 0x5412
_TIOCLINUX = 0x541C

_X86_64 = {
    "socket": 41, "socketpair": 53, "ioctl": 16, "clone": 56, "clone3": 435, "unshare": 272, "setns": 308,
    "mount": 165, "umount2": 166, "pivot_root": 155, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "keyctl": 250, "add_key": 248, "request_key": 249,
}  # fmt: skip
_AARCH64 = {
    "socket": 198, "socketpair": 199, "ioctl": 29, "clone": 220, "clone3": 435, "unshare": 97, "setns": 268,
    "mount": 40, "umount2": 39, "pivot_root": 41, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "open_tree_attr": 467,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "keyctl": 219, "add_key": 217, "request_key": 218,
}  # fmt: skip
_MACHINES = {"x86_64": (_AUDIT_ARCH_X86_64, _X86_64), "aarch64": (_AUDIT_ARCH_AARCH64, _AARCH64)}
_REFUSED = (
    "mount", "umount2", "pivot_root", "open_tree", "open_tree_attr", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "setns", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key",
)  # fmt: skip


class UnsupportedArchitectureError(Exception):
    """No filter is known for this machine (only x86_64 and aarch64 are)."""


class _Program:
    """A tiny assembler: instructions with symbolic forward jump targets."""

    def __init__(self) -> None:
        self._code: list[tuple[int, str | int, str | int, int]] = []
        self._labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def op(self, code: int, k: int, jt: str | int = 0, jf: str | int = 0) -> None:
        self._code.append((code, jt, jf, k))

    def bytes(self) -> bytes:
        out = bytearray()
        for at, (code, jt, jf, k) in enumerate(self._code):
            offsets = []
            for target in (jt, jf):
                offset = target if isinstance(target, int) else self._labels[target] - at - 1
                if not 0 <= offset <= 255:
                    raise AssertionError(f"seccomp jump out of range at {at}: {target!r}")
                offsets.append(offset)
            out += struct.pack("<HBBI", code, offsets[0], offsets[1], k)
        return bytes(out)


def build_filter(*, unix_sockets: bool, machine: str | None = None) -> bytes:
    """The filter for this machine (or ``machine``, a :func:`platform.machine` name), as bytes for ``bwrap``.

    Args:
        unix_sockets: allow creating unix sockets (``socket(AF_UNIX)``, datagram ``socketpair``).

    Raises:
        UnsupportedArchitectureError: no filter is known for the machine.
    """
    name = platform.machine() if machine is None else machine
    if name not in _MACHINES:
        raise UnsupportedArchitectureError(
            f"the bash sandbox's seccomp filter knows x86_64 and aarch64 only; this machine is {name!r}"
        )
    arch, numbers = _MACHINES[name]
    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.op(_JEQ_K, arch, 0, "kill")
    p.op(_LD_W_ABS, _NR)
    if arch == _AUDIT_ARCH_X86_64:
        p.op(_JGE_K, _X32_SYSCALL_BIT, "kill", 0)
    rules: list[tuple[str, str]] = [(syscall, "eperm") for syscall in _REFUSED]
    rules += [("clone3", "enosys"), ("clone", "clone"), ("unshare", "clone"), ("ioctl", "ioctl")]
    if not unix_sockets:
        rules += [("socket", "socket"), ("socketpair", "socketpair")]
    for syscall, target in rules:
        p.op(_JEQ_K, numbers[syscall], target, 0)
    p.op(_RET_K, _RET_ALLOW)
    p.label("clone")  # clone(flags, ...) and unshare(flags): flags are argument 0
    p.op(_LD_W_ABS, _arg(0))
    p.op(_JSET_K, _CLONE_NEWUSER, "eperm", "allow")
    p.label("ioctl")  # ioctl(fd, cmd, ...): cmd is an unsigned int
    p.op(_LD_W_ABS, _arg(1))
    p.op(_JEQ_K, _TIOCSTI, "eperm", 0)
    p.op(_JEQ_K, _TIOCLINUX, "eperm", "allow")
    if not unix_sockets:
        p.label("socket")
        p.op(_LD_W_ABS, _arg(0))
        p.op(_JEQ_K, _AF_UNIX, "eperm", "allow")
        p.label("socketpair")
        p.op(_LD_W_ABS, _arg(0))
        p.op(_JEQ_K, _AF_UNIX, 0, "allow")
        p.op(_LD_W_ABS, _arg(1))
        p.op(_AND_K, _SOCK_TYPE_MASK)
        p.op(_JEQ_K, _SOCK_DGRAM, "eperm", "allow")
    p.label("allow")
    p.op(_RET_K, _RET_ALLOW)
    p.label("eperm")
    p.op(_RET_K, _RET_ERRNO | errno.EPERM)
    p.label("enosys")
    p.op(_RET_K, _RET_ERRNO | errno.ENOSYS)
    p.label("kill")
    p.op(_RET_K, _RET_KILL_PROCESS)
    return p.bytes()
