import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_compiler():
    """Each test compiles its blocks afresh: compiled code cached by earlier tests would count
    against torch.compile's recompile limit (past it, blocks silently run eagerly)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
