"""scripts/setup.sh's first step: a cargo older than Cargo.toml's rust-version (or none) is
replaced by rustup's toolchain, and where rustup's installer cannot be reached the script stops
at once, before the Debian packages and pip, naming the version it needs."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rust_min() -> str:
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    return re.search(r'^rust-version = "([0-9.]+)"', text, re.M).group(1)


def run_setup(tmp_path, fake_cargo: str | None):
    """setup.sh with only `fake_cargo` (a version string, or none) as cargo, no rustup, a HOME
    without ~/.cargo, and rustup's installer at an address that refuses connections."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if fake_cargo is not None:
        cargo = bin_dir / "cargo"
        cargo.write_text(f"#!/bin/sh\necho 'cargo {fake_cargo} (Debian)'\n")
        cargo.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(home),
        "RUSTUP_INIT_URL": "https://127.0.0.1:9/rustup-init.sh",
        "LANG": "C.UTF-8",
    }
    start = time.monotonic()
    p = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")], env=env, cwd=ROOT,
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    return p, time.monotonic() - start


def assert_stopped_first(p, seconds: float, why: str):
    out = p.stdout + p.stderr
    assert p.returncode != 0, out
    assert why in out, out
    assert f"needs Rust {rust_min()} or later" in out, out
    assert "https://rustup.rs" in out, out
    # nothing long ran before it: no Debian packages, no venv, no pip
    for later in ("apt-get install", "creating venv", "pip install", "tritonserver"):
        assert later not in out, f"setup reached '{later}' before stopping:\n{out}"
    assert seconds < 60, f"setup took {seconds:.0f} s to stop"
    print(f"\n[setup] stopped in {seconds:.1f} s: {p.stderr.strip().splitlines()[-1]}")


def test_the_minimum_is_the_one_the_readme_states():
    readme = open(os.path.join(ROOT, "README.md")).read()
    assert f"Rust {rust_min()} or later" in readme or f"Rust toolchain of {rust_min()} or later" in readme


def test_a_too_old_cargo_stops_before_apt_and_pip(tmp_path):
    p, seconds = run_setup(tmp_path, "1.63.0")
    assert_stopped_first(p, seconds, f"cargo 1.63.0 is older than {rust_min()}")


@pytest.mark.skipif(shutil.which("cargo", path="/usr/bin:/bin") is not None or
                    shutil.which("rustup", path="/usr/bin:/bin") is not None,
                    reason="this machine has a cargo or rustup in /usr/bin")
def test_no_cargo_stops_before_apt_and_pip(tmp_path):
    p, seconds = run_setup(tmp_path, None)
    assert_stopped_first(p, seconds, "no cargo found")
