"""Images as values: canonical bytes, exact bytes preserved, transformations return new images."""

from __future__ import annotations

import json

import pytest

from servimg.core.digest import Digest
from servimg.core.errors import ImageError, ServimgError
from servimg.oci.image import OCI_LAYER, Descriptor, Image, Layer

CONFIG = {
    "architecture": "amd64",
    "os": "linux",
    "rootfs": {"type": "layers", "diff_ids": []},
    "config": {"Labels": {"a": "1"}},
}


def _layer(n: int) -> Layer:
    d = Digest.of_bytes(str(n).encode())
    return Layer(Descriptor(OCI_LAYER, d, n), d)


def test_digest_parse_and_errors() -> None:
    d = Digest.parse("sha256:" + "a" * 64)
    assert str(d) == "sha256:" + "a" * 64 and d.short == "a" * 12
    for bad in ("sha256:abc", "md5:" + "a" * 32, "nocolon", "sha256:" + "A" * 64):
        with pytest.raises(ServimgError):
            Digest.parse(bad)


def test_with_layer_returns_a_new_image_and_keeps_the_base() -> None:
    config = dict(CONFIG, rootfs={"type": "layers", "diff_ids": [str(_layer(1).diff_id)]})
    base = Image.create(config, [_layer(1)])
    new = base.with_layer(_layer(2), labels={"b": "2"}, created="2026-01-01T00:00:00Z", history="h")
    assert base.labels == {"a": "1"} and len(base.layers) == 1
    assert new.labels == {"a": "1", "b": "2"}
    assert [layer.diff_id for layer in new.layers] == [_layer(1).diff_id, _layer(2).diff_id]
    assert new.config["history"][-1]["created_by"] == "h"
    again = base.with_layer(_layer(2), labels={"b": "2"}, created="2026-01-01T00:00:00Z", history="h")
    assert again.digest == new.digest, "same inputs, same digest"


def test_exact_bytes_are_preserved() -> None:
    base = Image.create(CONFIG, [])
    spaced = json.dumps(json.loads(base.manifest_bytes), indent=3).encode()
    image = Image.parse(spaced, base.config_bytes)
    assert image.manifest_bytes == spaced and image.digest == Digest.of_bytes(spaced)


def test_parse_collects_every_problem() -> None:
    manifest = {
        "schemaVersion": 1,
        "mediaType": "text/plain",
        "config": {"mediaType": "x", "digest": "sha256:" + "0" * 64, "size": 2},
        "layers": [{"mediaType": "bogus", "digest": "sha256:" + "1" * 64, "size": 1}],
    }
    with pytest.raises(ImageError) as err:
        Image.parse(json.dumps(manifest).encode(), b"{}")
    text = str(err.value)
    for expected in ("schemaVersion", "mediaType", "hash to", "diff_ids", "not a layer type"):
        assert expected in text
