"""Small checks of nas/core and nas/search that a mutation run (benchmarks/mutation.py) found untested."""

from __future__ import annotations

import os

import numpy as np

from nas.spaces import SPACES


def test_the_default_exported_source_defaults_to_three_channel_32px_inputs():
    space = SPACES.create("spos", {})
    arch = space.sample(np.random.default_rng(0))
    text = space.source(arch, 10)
    assert "def Network(num_classes=10, in_channels=3, input_size=32):" in text


def test_a_released_run_dir_lock_names_no_holder(tmp_path):
    """The lock file stays (unlinking it would race a waiter) but is emptied: no stale pid in it."""
    from nas.search.rundir import RunDir

    run = RunDir(tmp_path)
    with run.lock():
        assert run.lock_path.read_text() == f"{os.getpid()}\n"
    assert run.lock_path.exists() and run.lock_path.read_bytes() == b""
