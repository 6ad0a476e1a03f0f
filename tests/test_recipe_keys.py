"""Every base's recipe key and image config, pinned (fast, no root): one `Recipe` type serves all kinds.

The key is a label of each base image and the config is hashed into its digest, so a change to either
moves the digest committed in verify/bases. The test bases' values were taken from the code before the
recipes became one type; the demo's since it became the one serving base (vLLM for CPU + LMCache). They
may change only together with a deliberate re-pin.
"""

from __future__ import annotations

import dataclasses

import pytest

from servimg.bases import catalog
from servimg.bases import pinned as basepin
from servimg.bases.assemble import base_config
from servimg.bases.demo import DEMO
from servimg.bases.recipe import Recipe
from servimg.bases.tiny import TEST
from servimg.core.errors import BaseBuildError
from servimg.core.platform import Platform

KEYS = {
    "demo": "d552dd882ec53d71ec2e8c8ac868f658b9b637f138fc3cee66b2852fddd41c65",
    "seed": "efc6c6194b50fd50e2a3fc6051343e0570903dcfb909f915fe1c1f6ea34e99cb",
    "test-bookworm": "db71e6ebb4d4625250482eab2e9ea6a7dacb7195b9f6623968d1dffb66f665a9",
    "test-trixie": "8f95bc94edbe64d28d44623a391a9ccd1896b6cb4eb7b3cc30fbe298a32b19f1",
}
PYTHON = {"demo": "3.11", "seed": "3.11", "test-bookworm": "3.11", "test-trixie": "3.13"}


def test_the_catalog_lists_every_pinned_base() -> None:
    assert set(catalog.BASES) == set(KEYS)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_each_base_keeps_its_recipe_key_and_tag(name: str) -> None:
    recipe = catalog.pinned_recipe(name)
    pin = basepin.load(name)
    assert pin is not None
    assert recipe.cache_key() == KEYS[name] == pin.recipe_key
    engine = f"{name}-base" if name in ("demo", "seed") else "test-base"
    assert recipe.tag() == f"servimg/{engine}:{recipe.suite}-{KEYS[name][:12]}"


@pytest.mark.parametrize("name", sorted(KEYS))
def test_each_base_config_is_the_pinned_config(name: str) -> None:
    """The config a build writes (labels, history, env) is byte for byte the committed one."""
    recipe = catalog.pinned_recipe(name)
    pin = basepin.load(name)
    assert pin is not None
    diff_ids = [str(diff_id) for _, diff_id in pin.layers]
    assert base_config(recipe, PYTHON[name], diff_ids) == pin.config


def test_an_unpinned_recipe_has_no_key() -> None:
    with pytest.raises(BaseBuildError, match="no Debian packages pinned"):
        catalog.get("demo").cache_key()


def test_a_source_wheel_kind_refuses_pinned_wheels() -> None:
    demo = catalog.pinned_recipe("demo")
    with pytest.raises(BaseBuildError):
        Recipe(TEST, "test-x", demo.debian_pins, demo.wheels)


def test_the_kind_and_name_are_no_input_of_the_key() -> None:
    """Two names for the same inputs are the same base; another kind's key document is another key."""
    demo = catalog.pinned_recipe("demo")
    assert dataclasses.replace(demo, name="other").cache_key() == demo.cache_key()
    test = catalog.pinned_recipe("test-bookworm")
    assert Recipe(DEMO, "d", test.debian_pins).cache_key() != test.cache_key()


# The arm64 bases (issue 32): their own pins (verify/bases/NAME.arm64.*), `arch: arm64` in their key
# document; the amd64 keys above did not move when the architecture entered the pins.
ARM64_KEYS = {
    "demo": "2fa478233a606dfe847cb17202d2bc8b4b778c2d750557cc970a1a93e3c685c0",
    "test-bookworm": "fd34e14620a9b729e1a2abc95a7fd24abd877896a1ec2ef1159a6aa5937860ab",
}


@pytest.mark.parametrize("name", sorted(ARM64_KEYS))
def test_each_arm64_base_keeps_its_key_tag_and_config(name: str) -> None:
    recipe = catalog.pinned_recipe(name, Platform.parse("linux/arm64"))
    pin = basepin.load(recipe.name)
    assert pin is not None and recipe.name == f"{name}.arm64"
    assert recipe.cache_key() == ARM64_KEYS[name] == pin.recipe_key
    engine = f"{name}-base" if name in ("demo", "seed") else "test-base"
    assert recipe.tag() == f"servimg/{engine}:{recipe.suite}-arm64-{ARM64_KEYS[name][:12]}"
    diff_ids = [str(diff_id) for _, diff_id in pin.layers]
    assert base_config(recipe, PYTHON[name], diff_ids) == pin.config
    assert pin.config["architecture"] == "arm64"
