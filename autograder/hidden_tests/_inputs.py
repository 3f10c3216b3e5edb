"""Random inputs for the hidden tests, drawn from the generator each test is given."""

import torch


def randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    """Standard normal entries of the given shape, times ``scale``."""
    return torch.randn(*shape, generator=g) * scale


def random_mask(g: torch.Generator, *shape: int) -> torch.Tensor:
    """A bool mask (True = may attend) with at least one True in every row."""
    mask = torch.rand(*shape, generator=g) < 0.6
    mask[..., torch.randint(shape[-1], (), generator=g)] = True
    return mask
