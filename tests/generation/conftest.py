"""The embedded model, loaded once for the generation tests."""

from __future__ import annotations

import pytest
import torch

import constrain


@pytest.fixture(scope="package")
def llm():
    """The embedded model on one torch thread (two threads that wait for each other are slower on 2 cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield constrain.LLM()
    torch.set_num_threads(threads)
