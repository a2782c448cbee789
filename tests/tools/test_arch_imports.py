"""scripts/check_architecture.py's rule 5 (no file imports up into its crate's root): it holds on
every crate of the workspace, and an upward import injected into a copy of any of them is found,
named by file and item."""
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from arch_imports import ROOT_ITEM, code_of, upward_imports  # noqa: E402

CRATES = sorted(p.parent for p in ROOT.glob("crates/*/src/lib.rs")) + [ROOT / "src"]


def test_every_crate_keeps_the_rule():
    found = [(f.relative_to(ROOT), what) for src in CRATES for f, what in upward_imports(src)]
    assert not found, found


@pytest.mark.parametrize("src", CRATES, ids=lambda p: p.parent.name if p.name == "src" else p.name)
def test_an_injected_upward_import_is_found(tmp_path, src):
    copy = tmp_path / "src"
    shutil.copytree(src, copy)
    defined = sorted(ROOT_ITEM.findall(code_of((copy / "lib.rs").read_text())))
    inner = sorted(p for p in copy.rglob("*.rs") if p.name not in ("lib.rs", "tests.rs"))
    if not inner:
        pytest.skip("a crate of one file")
    # an item of the root's own (or one made for the test, where the root defines none)
    if not defined:
        with open(copy / "lib.rs", "a") as f:
            f.write("\npub fn injected_helper() {}\n")
        defined = ["injected_helper"]
    target = inner[0]
    text = target.read_text()
    target.write_text(f"use crate::{defined[0]};\n" + text)
    found = upward_imports(copy)
    assert (target, f"crate::{defined[0]}") in found, found
    # the braced form too
    target.write_text(f"use crate::{{self as root, {defined[0]}}};\n" + text)
    assert (target, f"crate::{defined[0]}") in upward_imports(copy)
    # and from a file right below the root, through `super`
    below = [p for p in inner if p.parent == copy]
    if below:
        below[0].write_text("use super::*;\n" + below[0].read_text())
        assert (below[0], "super::*") in upward_imports(copy)
    print(f"\n{src.relative_to(ROOT)}: injected `use crate::{defined[0]};` into {target.relative_to(copy)}: found")
