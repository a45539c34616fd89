"""The sandbox's binds that keep git's hooks and configuration read-only (``SandboxPolicy.protect_git``).

Git runs what a repository's hooks and configuration name, outside the
sandbox, on the user's next ``git`` command: a command that could write them
would escape.  In each writable directory (a *root*) whose repository exists
as the command starts the binds make read-only (docs/sandbox.rst, "Git"),
those that git honours once they exist made first when missing (below):

* of the repository ``root/.git``: ``hooks``, ``config``, ``config.worktree``
  and ``commondir``, and the same of the common git directory its
  ``commondir`` names, where git takes hooks and configuration from;
* the same of every submodule's git directory (``.git/modules/<name>/``,
  nested ones included), and the ``.git`` *file* of its checkout (found from
  the module's ``core.worktree``) when it lies in a writable directory;
* ``config.worktree`` and ``commondir`` of every linked worktree
  (``.git/worktrees/<name>/``), the common git directory its ``commondir``
  names (protected already when it is ``root/.git``), and the ``.git`` *file*
  of its checkout (named by its ``gitdir`` file) when it lies in a writable
  directory;
* a ``root/.git`` *file* (``gitdir: ...``: a linked worktree, a submodule's
  checkout) itself, and the git directory it names (and that one's common
  directory) when it lies in a writable directory.

Relative paths are resolved against the base git uses, and read as git reads
them (after ``gitdir: ``, only the line ends at the end dropped): a ``.git``
file's against the directory holding the ``.git`` (a ``.git`` link's too, not
the directory of the file it leads to); a ``commondir``'s, a ``core.worktree``
and a linked worktree's ``gitdir`` file against the git directory holding them,
resolved.

A bind cannot cover a path that does not exist, so what git honours once it
exists is made, in every writable git directory, when it is missing as the
command starts, as git reads its absence: ``commondir`` holding ``.`` (the
git directory itself), ``hooks`` an empty directory (not in a linked
worktree's git directory, whose hooks git takes from the common one), and
``config.worktree`` an empty file when ``extensions.worktreeConfig`` is on.
Each is held for the command and removed after the last command holding it
(:mod:`._sandbox_hold`); one that cannot be made refuses the command.

Every directory from the root down to a protected path is bound onto itself
(a mount point cannot be renamed or removed: ``EBUSY``), so ``mv .git/modules
m`` cannot carry the protected paths away and put writable ones in their place.

Symbolic links are followed as git follows them, every link on the way
(:func:`follow`): a link cannot be a mount point, so one in a writable
directory could be replaced by a command, pointing git at a git directory of
its own, and the protection refuses to run (``BashError``: the link, its
target, the fix).  So a ``root/.git`` that is a link is always refused (the
fix: a ``.git`` *file* naming the resolved git directory, which is bound
read-only), and so is a link in a writable directory on the way from a ``.git``
file to its git directory, to a ``commondir``'s common directory, to a
``hooks``, ``config``, ``config.worktree`` or ``commondir`` that is a link
(git-new-workdir makes such), to a ``.git/modules`` or ``.git/worktrees`` entry,
or in the path of a hook's script.  A ``.git`` file naming a git directory
that is missing in a writable directory is refused too (a command could make
it).  Links outside every writable directory cannot be changed by a command:
they are followed, what they lead to protected where it is writable, and they
are reported (``links``) for the sandbox to check before later commands.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
from collections.abc import Callable, Sequence

import attrs

from .._errors import BashError
from ._sandbox_hold import Hold

# What a git directory holds that names commands git runs (or, commondir, where they are).
_PROTECTED = ("hooks", "config", "config.worktree", "commondir")
# How deep, and how many directories, the search for submodules' git directories goes (each command).
_MAX_DEPTH = 8
_MAX_DIRECTORIES = 2000
# How many symbolic links one path may go through (as the kernel's bound).
_MAX_LINKS = 40
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


def follow(path: str) -> tuple[str | None, list[tuple[str, str]]]:
    """``path`` resolved as the kernel resolves it, and every symbolic link followed on the way, in order
    (each at its own resolved place, with its target as read); the path is None on a loop."""
    links: list[tuple[str, str]] = []
    resolved = "/"
    pending = list(reversed(path.split("/")))
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, name)
        try:
            target = os.readlink(candidate)
        except OSError:  # not a link, or not there
            resolved = candidate
            continue
        links.append((candidate, target))
        if len(links) > _MAX_LINKS:
            return None, links
        if target.startswith("/"):
            resolved = "/"
        pending.extend(reversed(target.split("/")))
    return resolved, links


def _q(path: str) -> str:
    return shlex.quote(path)


@attrs.frozen
class _Walk:
    """What one command's search needs: its writable directories, the pin, and where followed links are noted."""

    roots: Sequence[str]
    pin: Pin
    links: dict[str, str]
    hold: Hold

    def writable(self, path: str) -> bool:
        return any(_under(path, root) for root in self.roots)

    def follow(self, path: str, what: str, fix: Callable[[str], str], *, own: bool = False) -> str:
        """``path`` resolved, refusing when a symbolic link git follows on the way lies in a writable directory
        (a command could replace it: a link cannot be a mount point).

        Args:
            path: the path as git goes it (absolute).
            what: what git reaches through it, for the message.
            fix: the repair, given the resolved path, for the message.
            own: the last link, ``path`` itself, may lie in a writable directory (its directory is bound
                read-only, as a hooks directory is).

        Raises:
            BashError: naming the link, its target and the fix.
        """
        real, links = follow(path)
        for link, target in links:
            if own and link == path and self.writable(link):
                continue  # in a directory bound read-only
            if self.writable(link):
                shown = real if real is not None else "(a loop of links)"
                raise BashError(
                    f"the sandbox refuses to run: {link!r} is a symbolic link (to {target!r}) that git follows to "
                    f"reach {what} ({shown}), and it lies in a directory a command may write, so a command could "
                    "replace it and point git at files of its own, which git would run outside the sandbox; "
                    f"{fix(shown)}, or make the directory holding the link read-only (keep it out of the "
                    "sandbox's writable paths)"
                )
            self.links.setdefault(link, target)
        if real is None:
            raise BashError(
                f"the sandbox refuses to run: {path!r}, which git follows to reach {what}, is a loop of links"
            )
        return real

    def bind_target(self, target: str) -> list[str]:
        """Binds making a link's resolved ``target`` read-only, when it lies strictly inside a writable directory
        (elsewhere it is read-only already; one holding a writable directory is never bound)."""
        if not os.path.lexists(target) or not self.writable(target) or any(_under(root, target) for root in self.roots):
            return []
        return [*self.pin(os.path.dirname(target)), "--ro-bind", target, target]


def _copy_fix(link: str) -> Callable[[str], str]:
    return lambda real: (
        f"replace {link!r} with a copy of what it leads to (rm {_q(link)} && cp -a {_q(real)} {_q(link)})"
    )


def _gitfile_fix(gitfile: str) -> Callable[[str], str]:
    return lambda real: (
        f"replace {gitfile!r} with a .git file naming the resolved git directory, a regular file the sandbox makes "
        f"read-only (rm -f {_q(gitfile)} && echo {_q('gitdir: ' + real)} > {_q(gitfile)})"
    )


def _gitdir_binds(gitdir: str, walk: _Walk, *, make_hooks: bool, common: str | None = None) -> list[str]:
    """Pin ``gitdir`` and make its hooks and configuration read-only (``common``: the git directory whose
    configuration applies, for a linked worktree's); a part that is a symbolic link at its resolved place,
    and so the scripts of hooks that are links."""
    binds = walk.pin(gitdir)
    writable = walk.writable(gitdir)  # elsewhere (a .git file's target) it is read-only but for its links
    hooks = os.path.join(gitdir, "hooks")
    config = os.path.join(gitdir, "config")
    if writable:
        # What git honours once it exists: made for the command when missing (as git reads its absence),
        # and held while it runs, by every command, so that no other ends and removes it meanwhile
        # (_sandbox_hold); bound read-only below, so a command cannot create it.
        if make_hooks and not os.path.islink(hooks):
            walk.hold.ensure(hooks, None, "git runs the hooks in it")
        commondir = os.path.join(gitdir, "commondir")
        if not os.path.islink(commondir):
            # '.': the git directory itself, as without one
            walk.hold.ensure(
                commondir, b".\n", "git takes hooks and configuration from the git directory a commondir names"
            )
        worktree_config = os.path.join(gitdir, "config.worktree")
        if not os.path.islink(worktree_config) and (
            os.path.lexists(worktree_config)
            or _WORKTREE_CONFIG.search(_read(os.path.join(common, "config") if common is not None else config))
        ):
            walk.hold.ensure(worktree_config, b"", "git reads its configuration, extensions.worktreeConfig being on")
    for name in _PROTECTED:
        path = os.path.join(gitdir, name)
        if os.path.islink(path):
            target = walk.follow(path, f"the {name} of the git directory {gitdir!r}", _copy_fix(path))
            binds += walk.bind_target(target)
            if name == "hooks":
                hooks = target
        elif writable and os.path.lexists(path):
            binds += ["--ro-bind", path, path]
    return binds + _hook_scripts(hooks, walk)


def _hook_scripts(hooks: str, walk: _Walk) -> list[str]:
    """Binds making read-only, in a writable directory, the scripts that hooks which are links lead to
    (``.git/hooks/pre-commit -> ../../tools/pre-commit``); the hooks directory itself is read-only already."""
    binds: list[str] = []
    with contextlib.suppress(OSError):
        for entry in sorted(os.scandir(hooks), key=lambda entry: entry.name):
            if entry.is_symlink():
                target = walk.follow(entry.path, f"the hook {entry.path!r}", _copy_fix(entry.path), own=True)
                binds += walk.bind_target(target)
    return binds


def _module_gitdirs(modules: str, walk: _Walk) -> list[str]:
    """The git directories of submodules under ``modules`` (a ``.git/modules``), nested ones included, those
    that are symbolic links resolved (refused where a command could replace the link)."""
    found: list[str] = []
    budget = _MAX_DIRECTORIES
    stack = [(modules, 0)]
    while stack and budget > 0:
        directory, depth = stack.pop()
        try:
            entries = sorted(
                (entry.name, entry.is_symlink())
                for entry in os.scandir(directory)
                if entry.is_symlink() or entry.is_dir(follow_symlinks=False)
            )
        except OSError:
            continue
        for name, is_link in entries:
            budget -= 1
            path = os.path.join(directory, name)
            if is_link:
                path = walk.follow(path, f"the submodule git directory {path!r}", _copy_fix(path))
                if not os.path.isdir(path):
                    continue
            if _is_gitdir(path):
                found.append(path)
                if os.path.isdir(os.path.join(path, "modules")) and depth + 1 < _MAX_DEPTH:
                    stack.append((os.path.join(path, "modules"), depth + 1))
            elif depth + 1 < _MAX_DEPTH and name not in _NOT_MODULES:
                stack.append((path, depth + 1))  # a submodule named with a slash: a/b
    return sorted(set(found))


def _gitfile_named(gitfile: str) -> str | None:
    """The path a ``.git`` file names, as git reads it: after ``gitdir: ``, only the line ends at its end
    dropped (spaces are part of the path; ``gitdir:path`` is no git file); or None."""
    text = _read(gitfile, 8192)
    if not text.startswith("gitdir: "):
        return None
    return text[len("gitdir: ") :].rstrip("\r\n") or None


def _commondir_named(gitdir: str) -> str | None:
    """The path ``gitdir``'s ``commondir`` names, as git reads it (only the line ends at its end dropped; an
    empty one git refuses to read), or None."""
    return _read(os.path.join(gitdir, "commondir"), 8192).rstrip("\r\n") or None


def git_directories(root: str) -> list[str]:
    """The git directories, resolved, the repository at ``root`` uses: its ``.git`` (followed when it is a
    symbolic link), or the one a ``.git`` file names, and that one's common directory (its ``commondir``)."""
    git = os.path.join(root, ".git")
    real = os.path.realpath(git)
    if os.path.isdir(real):
        gitdir = real
    else:
        named = _gitfile_named(real) if os.path.isfile(real) else None
        if named is None:
            return []
        # relative to the directory holding .git, as git reads it (not to where a .git link leads)
        gitdir = os.path.realpath(os.path.join(root, named))
        if not os.path.isdir(gitdir):
            return []
    named_common = _commondir_named(gitdir)
    return [gitdir, os.path.realpath(os.path.join(gitdir, named_common))] if named_common else [gitdir]


def linked_parts(gitdir: str) -> list[str]:
    """The resolved targets of ``gitdir``'s hooks and configuration that are symbolic links."""
    paths = (os.path.join(gitdir, name) for name in _PROTECTED)
    return [os.path.realpath(path) for path in paths if os.path.islink(path)]


def git_binds(
    root: str, roots: Sequence[str], pin: Pin, links: dict[str, str] | None = None, *, hold: Hold
) -> list[str]:
    """The binds protecting the git repository at ``root`` (see the module's docstring).

    Args:
        root: a writable directory of the command (resolved).
        roots: every writable directory of the command (resolved).
        pin: binds pinning a directory up to its writable root.
        links: filled with the symbolic links git follows to reach what is protected (path -> target as
            read), none of them in ``roots``, for the sandbox to check before later commands.
        hold: holds what is made for the command (a missing ``hooks``, ``commondir``, ``config.worktree``),
            to release once the command ended (:class:`~._sandbox_hold.Hold`).

    Raises:
        BashError: the protection cannot hold: a symbolic link git follows lies in a writable directory
            (a command could replace it), a ``.git`` file names a git directory that is missing there, or
            a part to make could not be made.
    """
    walk = _Walk(roots, pin, {} if links is None else links, hold)
    git = os.path.join(root, ".git")
    if os.path.islink(git):

        def fix(real: str) -> str:
            if os.path.isfile(real):
                return f"replace {git!r} with a copy of the .git file it leads to (the path it names made absolute)"
            return _gitfile_fix(git)(real)

        resolved = walk.follow(git, "the repository's git directory", fix)  # refuses: root is writable
        if os.path.isfile(resolved):
            return [*walk.bind_target(resolved), *_gitfile_binds(resolved, walk, base=root)]
        if not os.path.isdir(resolved) or not _is_gitdir(resolved):
            return []
        return _repo_binds(resolved, walk)
    if os.path.isfile(git):
        # read-only, and a mount point cannot be renamed or removed
        return ["--ro-bind", git, git, *_gitfile_binds(git, walk, base=root)]
    if not os.path.isdir(git):
        return []  # no repository
    return _repo_binds(git, walk)


def _missing(what: str, named: str, real: str, fix: str) -> BashError:
    return BashError(
        f"the sandbox refuses to run: {what} names the git directory {named!r} ({real}), which is not a git "
        "directory (missing, or without HEAD and config) and lies in a directory a command may write: a command "
        f"could make it, with hooks and configuration git would run outside the sandbox; {fix}"
    )


def _gitfile_binds(gitfile: str, walk: _Walk, *, base: str) -> list[str]:
    """The git directory a ``.git`` file names (relative to ``base``, as git reads it), and its common
    directory: their hooks and configuration read-only where they are writable, their links checked."""
    named = _gitfile_named(gitfile)
    if named is None:
        return []  # git refuses it too ("invalid gitfile format")
    target = walk.follow(os.path.join(base, named), f"the git directory {gitfile!r} names", _gitfile_fix(gitfile))
    if not _is_gitdir(target):
        if walk.writable(target):
            raise _missing(
                repr(gitfile),
                named,
                target,
                f"remove {gitfile!r} if its repository is gone, or put its git directory back",
            )
        return []
    return _shared_binds(target, walk, set())


def _common(gitdir: str, walk: _Walk) -> str | None:
    """The common git directory ``gitdir``'s ``commondir`` names (relative to ``gitdir``, resolved, as git
    reads it), resolved, or None: no ``commondir``, or one naming no git directory outside every writable one."""
    named = _commondir_named(gitdir)
    if named is None:
        return None
    commondir = os.path.join(gitdir, "commondir")
    common = walk.follow(
        os.path.join(gitdir, named),
        f"the common git directory {commondir!r} names",
        lambda real: f"write the resolved path into {commondir!r} (echo {_q(real)} > {_q(commondir)})",
    )
    if not _is_gitdir(common):
        if walk.writable(common):
            raise _missing(repr(commondir), named, common, "put the common git directory back")
        return None
    return common


def _shared_binds(gitdir: str, walk: _Walk, bound: set[str]) -> list[str]:
    """``gitdir`` (resolved) protected, and the common git directory its ``commondir`` names, whose hooks and
    configuration git uses (a linked worktree's, or any git directory's: git reads a ``commondir`` in each);
    the git directories in ``bound`` are protected already, and those protected here are added to it."""
    common = _common(gitdir, walk)
    if common == gitdir:
        common = None  # a commondir of '.' (left by a harness killed while a command ran): its own
    binds = _gitdir_binds(gitdir, walk, make_hooks=common is None, common=common)
    bound.add(gitdir)
    if common is not None and common not in bound:
        binds += _gitdir_binds(common, walk, make_hooks=True)
        bound.add(common)
    return binds


def _checkout_gitfile_binds(gitfile: str, walk: _Walk, what: str) -> list[str]:
    """A checkout's ``.git`` file (a submodule's, a linked worktree's) read-only when it lies in a writable
    directory, so a command cannot point it at a git directory of its own; one that is a link followed."""
    if os.path.islink(gitfile):  # git in the checkout follows it
        return walk.bind_target(walk.follow(gitfile, what, _copy_fix(gitfile)))
    if walk.writable(gitfile) and os.path.isfile(gitfile):
        return [*walk.pin(os.path.dirname(gitfile)), "--ro-bind", gitfile, gitfile]
    return []


def _repo_binds(git: str, walk: _Walk) -> list[str]:
    """A repository's git directory ``git`` (resolved), its submodules' and its linked worktrees'."""
    bound: set[str] = set()
    binds = _shared_binds(git, walk, bound)
    modules = os.path.join(git, "modules")
    if os.path.islink(modules):
        modules = walk.follow(modules, "the submodules' git directories", _copy_fix(modules))
    if os.path.isdir(modules):
        for gitdir in _module_gitdirs(modules, walk):
            binds += _shared_binds(gitdir, walk, bound)
            found = _WORKTREE_KEY.search(_read(os.path.join(gitdir, "config")))
            if found is not None:
                # core.worktree: relative to the module's git directory
                checkout = os.path.realpath(os.path.join(gitdir, found.group(1).strip('"')))
                binds += _checkout_gitfile_binds(os.path.join(checkout, ".git"), walk, "the submodule's .git file")
    worktrees = os.path.join(git, "worktrees")
    if os.path.islink(worktrees):
        worktrees = walk.follow(worktrees, "the linked worktrees' git directories", _copy_fix(worktrees))
    if os.path.isdir(worktrees):
        with contextlib.suppress(OSError):
            for entry in sorted(os.scandir(worktrees), key=lambda entry: entry.name):
                path = entry.path
                if entry.is_symlink():
                    path = walk.follow(path, f"the linked worktree's git directory {path!r}", _copy_fix(path))
                if not os.path.isdir(path):
                    continue
                binds += _shared_binds(path, walk, bound)
                # Its gitdir file names the worktree's .git file (relative to this directory, as git reads it).
                named = _read(os.path.join(path, "gitdir"), 8192).rstrip("\r\n")
                if named:
                    gitfile = os.path.join(os.path.realpath(os.path.dirname(os.path.join(path, named))), ".git")
                    binds += _checkout_gitfile_binds(gitfile, walk, "the linked worktree's .git file")
    return binds
