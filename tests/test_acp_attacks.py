"""Attacks on the ACP bridge's new inputs: lying image blocks (docs/editors.rst, docs/acp.rst)."""

from __future__ import annotations

import base64

import pytest

from trio_harness.acp._jsonrpc import RpcError
from trio_harness.acp._params import PromptParams, decode_params

PNG = b"\x89PNG\r\n\x1a\n" + bytes(32)
JPEG = b"\xff\xd8\xff\xe0" + bytes(32)


def prompt(data: bytes, mime: str) -> dict[str, object]:
    block = {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": mime}
    return {"sessionId": "s", "prompt": [{"type": "text", "text": "look"}, block]}


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (JPEG, "image/png", "prompt[1] has mimeType 'image/png' but its data is an image/jpeg image"),
        (b"<svg onload=alert(1)>", "image/png", "its data is not a PNG, JPEG, GIF or WebP image"),
        (PNG, "image/webp", "mimeType 'image/webp' but its data is an image/png image"),
    ],
)
def test_an_image_whose_data_is_not_its_mime_type_is_invalid(data: bytes, mime: str, message: str) -> None:
    """Logged and resent in every later request, a lying image would make the provider refuse them all."""
    with pytest.raises(RpcError, match="invalid") as caught:
        decode_params(PromptParams, prompt(data, mime))
    assert caught.value.code == -32602 and message in caught.value.message


def test_an_image_that_is_what_it_says_is_taken() -> None:
    params = decode_params(PromptParams, prompt(PNG, "image/png"))
    assert [image.media_type for image in params.images] == ["image/png"]
