"""Images in requests: what a provider that cannot take them reports.

A provider declares whether its route takes images with a ``supports_images``
attribute (a model catalog may set it per model); one that cannot refuses a
request carrying any with :func:`images_unsupported`, before sending anything.
"""

from __future__ import annotations

import os

from .._errors import ModelError
from .._records import Failure, Image
from ._protocol import ModelRequest, UserMessage


def has_images(request: ModelRequest) -> bool:
    """Whether any user message of ``request`` carries images."""
    return any(type(message) is UserMessage and message.images for message in request.messages)


def supports_images(provider: object) -> bool:
    """Whether ``provider`` takes images: its ``supports_images`` attribute, False when it has none."""
    return getattr(provider, "supports_images", False) is True


def images_unsupported(provider: str, model: str) -> Failure:
    """The failure of a request with images to a route that cannot take them (code ``images-unsupported``)."""
    return Failure(
        "images-unsupported",
        f"{provider}: model {model!r} does not take images (its provider has supports_images=False); "
        "remove the images or use a model that takes them",
    )


_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def sniff_media_type(data: bytes) -> str | None:
    """The media type of an image file's bytes, from its signature (PNG, JPEG, GIF, WebP), or None."""
    for signature, media_type in _SIGNATURES:
        if data.startswith(signature):
            return media_type
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def load_image(path: str | os.PathLike[str]) -> Image:
    """Read an image file (PNG, JPEG, GIF or WebP, told by its content, not its name).

    Raises:
        ModelError: the file is missing or unreadable, is not one of those
            formats, or is larger than :data:`~trio_harness.events.MAX_IMAGE_BYTES`.
    """
    from ..session._events import MAX_IMAGE_BYTES

    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            data = file.read(MAX_IMAGE_BYTES + 1)
    except FileNotFoundError:
        raise ModelError(f"image file {name!r} does not exist") from None
    except OSError as exc:
        raise ModelError(f"image file {name!r} cannot be read: {exc.strerror or exc}") from None
    if len(data) > MAX_IMAGE_BYTES:
        raise ModelError(f"image file {name!r} is larger than the {MAX_IMAGE_BYTES} bytes a message image may have")
    media_type = sniff_media_type(data)
    if media_type is None:
        raise ModelError(f"image file {name!r} is not a PNG, JPEG, GIF or WebP image")
    return Image(data, media_type)
