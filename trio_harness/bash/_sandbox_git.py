"""The sandbox's binds that keep git's hooks and configuration read-only (``SandboxPolicy.protect_git``).

Git runs what a repository's hooks and configuration name, outside the
sandbox, on the user's next ``git`` command: a command that could write them
would escape.  In each writable directory (a *root*) the binds make read-only,
when they exist as the command starts (docs/sandbox.rst, "Threat model"):

* of the repository ``root/.git``: ``hooks`` (created empty when missing, so
  a command cannot create it and fill it), ``config``, ``config.worktree``
  (created empty when ``extensions.worktreeConfig`` is on and it is missing)
  and ``commondir``;
* the same of every submodule's git directory (``.git/modules/<name>/``,
  nested ones included), and the ``.git`` *file* of its checkout (found from
  the module's ``core.worktree``) when it lies in a writable directory;
* ``config.worktree`` and ``commondir`` of every linked worktree
  (``.git/worktrees/<name>/``);
* a ``root/.git`` *file* (``gitdir: ...``: a linked worktree, a submodule's
  checkout) itself, and the git directory it names (and that one's common
  directory) when it lies in a writable directory.

Every directory from the root down to a protected path is bound onto itself
(a mount point cannot be renamed or removed: ``EBUSY``), so ``mv .git/modules
m`` cannot carry the protected paths away and put writable ones in their place.

Symbolic links are followed: a ``root/.git`` that is a link (to a git
directory, or to a ``.git`` file) is protected at its resolved place as if it
were there, and so is the resolved target of a ``hooks``, ``config``,
``config.worktree`` or ``commondir`` that is a link (git-new-workdir makes
such).  A link itself cannot be a mount point, so a command could replace it;
every such link in a writable directory is reported (``links``: its path and
target), and the sandbox refuses the next command when one was replaced.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence

import attrs

# What a git directory holds that names commands git runs (or, commondir, where they are).
_PROTECTED = ("hooks", "config", "config.worktree", "commondir")
# How deep, and how many directories, the search for submodules' git directories goes (each command).
_MAX_DEPTH = 8
_MAX_DIRECTORIES = 2000
# Parts of a git directory that hold no git directory (skipped by the search).
_NOT_MODULES = frozenset(("objects", "refs", "logs", "hooks", "info", "lfs", "worktrees"))
_WORKTREE_KEY = re.compile(r"^\s*worktree\s*=\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_WORKTREE_CONFIG = re.compile(r"^\s*worktreeconfig\s*=\s*(true|yes|on|1)\s*$", re.IGNORECASE | re.MULTILINE)

Pin = Callable[[str], list[str]]
"""Binds pinning a directory and every directory above it up to its writable root (none outside every root)."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _read(path: str, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as file:
            return file.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _is_gitdir(path: str) -> bool:
    # By its config too: once protected it cannot be removed (HEAD can, to hide the directory).
    if os.path.islink(path):
        return False
    return os.path.isfile(os.path.join(path, "HEAD")) or os.path.isfile(os.path.join(path, "config"))


@attrs.frozen
class _Walk:
    """What one command's search needs: its writable directories, the pin, and where links are reported."""

    roots: Sequence[str]
    pin: Pin
    links: dict[str, str]

    def writable(self, path: str) -> bool:
        return any(_under(path, root) for root in self.roots)

    def link(self, path: str) -> str | None:
        """Report the symbolic link ``path`` when a command could replace it; its resolved target."""
        try:
            target = os.readlink(path)
        except OSError:
            return None
        if self.writable(path):
            self.links.setdefault(path, target)
        return os.path.realpath(path)

    def bind_target(self, target: str) -> list[str]:
        """Binds making a link's resolved ``target`` read-only, when it lies strictly inside a writable directory
        (elsewhere it is read-only already; one holding a writable directory is never bound)."""
        if not os.path.lexists(target) or not self.writable(target) or any(_under(root, target) for root in self.roots):
            return []
        return [*self.pin(os.path.dirname(target)), "--ro-bind", target, target]


def _gitdir_binds(gitdir: str, walk: _Walk, *, make_hooks: bool, common: str | None = None) -> list[str]:
    """Pin ``gitdir`` and make its hooks and configuration read-only (``common``: the git directory whose
    configuration applies, for a linked worktree's); a part that is a symbolic link at its resolved place."""
    binds = walk.pin(gitdir)
    writable = walk.writable(gitdir)  # elsewhere (a symlinked .git's target) it is read-only but for its links
    hooks = os.path.join(gitdir, "hooks")
    if writable and make_hooks and not os.path.lexists(hooks):
        with contextlib.suppress(OSError):
            os.mkdir(hooks)  # so a command cannot create it and fill it
    config = os.path.join(gitdir, "config")
    worktree_config = os.path.join(gitdir, "config.worktree")
    if (
        writable
        and not os.path.lexists(worktree_config)
        and _WORKTREE_CONFIG.search(_read(os.path.join(common, "config") if common is not None else config))
    ):
        # git reads it (extensions.worktreeConfig): an empty one, so a command cannot create it
        with contextlib.suppress(OSError):
            os.close(os.open(worktree_config, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    for name in _PROTECTED:
        path = os.path.join(gitdir, name)
        if os.path.islink(path):
            target = walk.link(path)
            if target is not None:
                binds += walk.bind_target(target)
        elif writable and os.path.lexists(path):
            binds += ["--ro-bind", path, path]
    return binds


def _module_gitdirs(modules: str) -> list[str]:
    """The git directories of submodules under ``modules`` (a ``.git/modules``), nested ones included."""
    found: list[str] = []
    budget = _MAX_DIRECTORIES
    stack = [(modules, 0)]
    while stack and budget > 0:
        directory, depth = stack.pop()
        try:
            entries = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir(follow_symlinks=False))
        except OSError:
            continue
        for name in entries:
            budget -= 1
            path = os.path.join(directory, name)
            if _is_gitdir(path):
                found.append(path)
                if os.path.isdir(os.path.join(path, "modules")) and depth + 1 < _MAX_DEPTH:
                    stack.append((os.path.join(path, "modules"), depth + 1))
            elif depth + 1 < _MAX_DEPTH and name not in _NOT_MODULES:
                stack.append((path, depth + 1))  # a submodule named with a slash: a/b
    return sorted(found)


def _gitfile_target(gitfile: str) -> str | None:
    """The git directory a ``.git`` file names (``gitdir: <path>``), resolved, or None."""
    text = _read(gitfile, 8192)
    if not text.startswith("gitdir:"):
        return None
    target = text[len("gitdir:") :].strip()
    return os.path.realpath(os.path.join(os.path.dirname(gitfile), target)) if target else None


def git_directories(root: str) -> list[str]:
    """The git directories, resolved, the repository at ``root`` uses: its ``.git`` (followed when it is a
    symbolic link), or the one a ``.git`` file names and that one's common directory."""
    real = os.path.realpath(os.path.join(root, ".git"))
    if os.path.isdir(real):
        return [real]
    target = _gitfile_target(real) if os.path.isfile(real) else None
    if target is None or not os.path.isdir(target):
        return []
    named = _read(os.path.join(target, "commondir"), 8192).strip()
    return [target, os.path.realpath(os.path.join(target, named))] if named else [target]


def linked_parts(gitdir: str) -> list[str]:
    """The resolved targets of ``gitdir``'s hooks and configuration that are symbolic links."""
    paths = (os.path.join(gitdir, name) for name in _PROTECTED)
    return [os.path.realpath(path) for path in paths if os.path.islink(path)]


def git_binds(root: str, roots: Sequence[str], pin: Pin, links: dict[str, str] | None = None) -> list[str]:
    """The binds protecting the git repository at ``root`` (see the module's docstring).

    Args:
        root: a writable directory of the command (resolved).
        roots: every writable directory of the command (resolved).
        pin: binds pinning a directory up to its writable root.
        links: filled with the symbolic links the protection follows that a command could replace
            (path -> target as read), for the sandbox to check before the next command.
    """
    walk = _Walk(roots, pin, {} if links is None else links)
    git = os.path.join(root, ".git")
    if os.path.islink(git):
        resolved = walk.link(git)
        if resolved is None:
            return []
        if os.path.isfile(resolved):
            return [*walk.bind_target(resolved), *_gitfile_binds(resolved, walk)]
        if not os.path.isdir(resolved) or not _is_gitdir(resolved):
            return []  # a dangling link, or to something that is not a git directory
        return _repo_binds(resolved, walk)
    if os.path.isfile(git):
        # read-only, and a mount point cannot be renamed or removed
        return ["--ro-bind", git, git, *_gitfile_binds(git, walk)]
    if not os.path.isdir(git):
        return []  # no repository
    return _repo_binds(git, walk)


def _gitfile_binds(gitfile: str, walk: _Walk) -> list[str]:
    """The git directory a ``.git`` file names, and its common directory, when they lie in a writable path."""
    binds: list[str] = []
    target = _gitfile_target(gitfile)
    if target is not None and walk.writable(target) and _is_gitdir(target):
        named = _read(os.path.join(target, "commondir"), 8192).strip()
        common = os.path.realpath(os.path.join(target, named)) if named else None
        binds += _gitdir_binds(target, walk, make_hooks=common is None, common=common)
        if common is not None and walk.writable(common) and _is_gitdir(common):
            binds += _gitdir_binds(common, walk, make_hooks=True)
    return binds


def _repo_binds(git: str, walk: _Walk) -> list[str]:
    """A repository's git directory ``git`` (resolved), its submodules' and its linked worktrees'."""
    binds = _gitdir_binds(git, walk, make_hooks=True)
    modules = os.path.join(git, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        for gitdir in _module_gitdirs(modules):
            binds += _gitdir_binds(gitdir, walk, make_hooks=True)
            found = _WORKTREE_KEY.search(_read(os.path.join(gitdir, "config")))
            if found is not None:
                checkout = os.path.realpath(os.path.join(gitdir, found.group(1).strip('"')))
                gitfile = os.path.join(checkout, ".git")
                if walk.writable(gitfile) and os.path.isfile(gitfile):
                    binds += [*walk.pin(checkout), "--ro-bind", gitfile, gitfile]
    worktrees = os.path.join(git, "worktrees")
    if os.path.isdir(worktrees) and not os.path.islink(worktrees):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(worktrees), key=lambda entry: entry.name):
                if entry.is_dir(follow_symlinks=False):
                    binds += _gitdir_binds(entry.path, walk, make_hooks=False, common=git)
    return binds
