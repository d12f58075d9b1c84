"""The example's model: a small MLP classifier (imported by train.py, shipped beside it)."""

import torch
from torch import nn

FEATURES = 8
CLASSES = 3


class MLP(nn.Module):
    """8 features -> 32 -> 32 -> 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, CLASSES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
