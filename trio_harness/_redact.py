"""Credentials out of URLs shown or stored: one helper for every message, event and log line.

:func:`redact_urls` replaces, in every ``scheme://...`` URL of a text, the
userinfo (``user:password@``) by ``***@`` and every query and fragment value
by ``***`` (``?key=***&token=***``); the rest of the text is left as it is.
The harness applies it wherever a URL is shown or stored: a model route's name
(``request/header`` events, failure messages), the command line's "continue
with" line, MCP configuration and start-up errors, and the PostgreSQL store's
connection URL (``redact_dsn``, which also hides a ``password=`` keyword).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

REDACTED: Final = "***"
"""What a hidden userinfo or query value is replaced by."""

# A URL starts at a scheme followed by "://".  Unquoted, it ends at a space or a
# character no URL holds; after an opening quote or bracket it runs to the next
# space, less the matching closer and any punctuation after it, so a quote or
# bracket inside a credential cannot end the URL early.
_START: Final = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://")
_END_PLAIN: Final = re.compile(r"[\s\"<>\\]")
_END_SPACE: Final = re.compile(r"\s")
_CLOSERS: Final = {"'": "'", '"': '"', "(": ")", "[": "]", "{": "}", "<": ">", "`": "`"}


def redact_urls(text: str, *, keep_user: bool = False, keep_query: Collection[str] = ()) -> str:
    """``text`` with the userinfo and the query and fragment values of every URL in it replaced by ``***``.

    ``https://user:pass@host/v1?key=abc#t=1`` becomes
    ``https://***@host/v1?key=***#t=***``; a query item without ``=`` is
    replaced whole.  Text without ``://`` is returned unchanged.  The
    authority ends at the first ``/`` after ``://``, and everything before its
    last ``@`` counts as userinfo, so a password with a raw ``@``, ``?`` or
    ``#`` is hidden too.  A URL in quotes or brackets (``'...'``, ``(...)``)
    ends at the last matching closer before the next space.

    Args:
        text: any text.
        keep_user: show the user name of the userinfo (``user:***@``), for
            URLs whose user names are not credentials (a PostgreSQL role);
            by default the whole userinfo is hidden, since a token is often
            given as the user name (``https://TOKEN@host``).
        keep_query: query keys (compared without regard to case) whose values
            are shown, for parameters that are not credentials (``host``).
    """
    if "://" not in text:
        return text
    parts: list[str] = []
    position = 0
    while True:
        found = _START.search(text, position)
        if found is None:
            break
        closer = _CLOSERS.get(text[found.start() - 1]) if found.start() > 0 else None
        end = (_END_PLAIN if closer is None else _END_SPACE).search(text, found.end())
        stop = len(text) if end is None else end.start()
        if closer is not None:
            last = text.rfind(closer, found.end(), stop)
            if last >= 0 and not text[last + 1 : stop].strip(",.;:"):
                stop = last
        parts.append(text[position : found.end()])
        parts.append(_redact_rest(text[found.end() : stop], keep_user, keep_query))
        position = stop
    parts.append(text[position:])
    return "".join(parts)


def _redact_rest(rest: str, keep_user: bool, keep_query: Collection[str]) -> str:
    """The part of a URL after ``scheme://``, redacted."""
    slash = rest.find("/")
    authority, tail = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    at = authority.rfind("@")
    if at >= 0:
        user, colon, _ = authority[:at].partition(":")
        shown = f"{user}{colon}{REDACTED if colon else ''}" if keep_user else REDACTED
        authority = f"{shown}@{authority[at + 1 :]}"
    starts = [index for index in (authority.find("?"), authority.find("#")) if index >= 0]
    if starts:
        # No path: the query or fragment starts inside what looked like the authority.
        authority, tail = authority[: min(starts)], authority[min(starts) :] + tail
    cut = min((index for index in (tail.find("?"), tail.find("#")) if index >= 0), default=-1)
    if cut < 0:
        return authority + tail
    path, suffix = tail[:cut], tail[cut:]
    kept = {key.lower() for key in keep_query}

    def hide(match: re.Match[str]) -> str:
        separator, key, equals, value = match.groups()
        if equals:
            if not value or (separator != "#" and key.lower() in kept):
                return match.group(0)
            return f"{separator}{key}={REDACTED}"
        return f"{separator}{REDACTED}" if key else separator

    return authority + path + _ITEM.sub(hide, suffix)


_ITEM: Final = re.compile(r"([?#&;])([^?#&;=]*)(=?)([^?#&;]*)")
