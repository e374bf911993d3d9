"""The model the training job uses by default: a small CNN for MNIST.

Two 5x5 convolutions (16 and 32 channels, each followed by ReLU and 2x2 max
pooling) and two linear layers, about 40k parameters. It is the PyTorch
tutorial's net made a little wider and without dropout, so that it reaches
99% test accuracy in a few epochs of plain momentum SGD while one step still
costs only a few milliseconds on one CPU thread. Without dropout the training
step draws no random numbers, which keeps resumed runs bitwise reproducible.
"""
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    """MNIST classifier: (N, 1, 28, 28) images to (N, 10) logits.

    Example::

        >>> Net()(torch.zeros(8, 1, 28, 28)).shape
        torch.Size([8, 10])
    """

    def __init__(self, hidden=64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)       # 28x28 -> 24x24, pooled to 12x12
        self.conv2 = nn.Conv2d(16, 32, 5)      # 12x12 -> 8x8, pooled to 4x4
        self.fc1 = nn.Linear(32 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)
