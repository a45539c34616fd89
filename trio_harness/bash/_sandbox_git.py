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
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence

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


def _gitdir_binds(gitdir: str, pin: Pin, *, make_hooks: bool, common: str | None = None) -> list[str]:
    """Pin ``gitdir`` and make its hooks and configuration read-only (``common``: the git directory whose
    configuration applies, for a linked worktree's)."""
    binds = pin(gitdir)
    hooks = os.path.join(gitdir, "hooks")
    if make_hooks and not os.path.lexists(hooks):
        with contextlib.suppress(OSError):
            os.mkdir(hooks)  # so a command cannot create it and fill it
    config = os.path.join(gitdir, "config")
    worktree_config = os.path.join(gitdir, "config.worktree")
    if not os.path.lexists(worktree_config) and _WORKTREE_CONFIG.search(
        _read(os.path.join(common, "config") if common is not None else config)
    ):
        # git reads it (extensions.worktreeConfig): an empty one, so a command cannot create it
        with contextlib.suppress(OSError):
            os.close(os.open(worktree_config, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644))
    for name in _PROTECTED:
        path = os.path.join(gitdir, name)
        if os.path.lexists(path) and not os.path.islink(path):
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


def git_binds(root: str, roots: Sequence[str], pin: Pin) -> list[str]:
    """The binds protecting the git repository at ``root`` (see the module's docstring).

    Args:
        root: a writable directory of the command (resolved).
        roots: every writable directory of the command (resolved).
        pin: binds pinning a directory up to its writable root.
    """
    git = os.path.join(root, ".git")
    if os.path.islink(git):
        return []  # a symbolic link cannot be made read-only (docs/sandbox.rst)
    if os.path.isfile(git):
        binds = ["--ro-bind", git, git]  # read-only, and a mount point cannot be renamed or removed
        target = _gitfile_target(git)
        if target is not None and any(_under(target, other) for other in roots) and _is_gitdir(target):
            named = _read(os.path.join(target, "commondir"), 8192).strip()
            common = os.path.realpath(os.path.join(target, named)) if named else None
            binds += _gitdir_binds(target, pin, make_hooks=common is None, common=common)
            if common is not None and any(_under(common, other) for other in roots) and _is_gitdir(common):
                binds += _gitdir_binds(common, pin, make_hooks=True)
        return binds
    if not os.path.isdir(git):
        return []  # no repository
    binds = _gitdir_binds(git, pin, make_hooks=True)
    modules = os.path.join(git, "modules")
    if os.path.isdir(modules) and not os.path.islink(modules):
        for gitdir in _module_gitdirs(modules):
            binds += _gitdir_binds(gitdir, pin, make_hooks=True)
            found = _WORKTREE_KEY.search(_read(os.path.join(gitdir, "config")))
            if found is not None:
                checkout = os.path.realpath(os.path.join(gitdir, found.group(1).strip('"')))
                gitfile = os.path.join(checkout, ".git")
                if any(_under(gitfile, other) for other in roots) and os.path.isfile(gitfile):
                    binds += [*pin(checkout), "--ro-bind", gitfile, gitfile]
    worktrees = os.path.join(git, "worktrees")
    if os.path.isdir(worktrees) and not os.path.islink(worktrees):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(worktrees), key=lambda entry: entry.name):
                if entry.is_dir(follow_symlinks=False):
                    binds += _gitdir_binds(entry.path, pin, make_hooks=False, common=git)
    return binds
