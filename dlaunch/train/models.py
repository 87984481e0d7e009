"""Models: torchvision ResNet-18/34/50/101/152 (random init, never downloaded) and ResNet-44.

ResNet-44 is He et al.'s CIFAR family (6n+2 layers, n=7): a 3x3 stem with 16 channels, three stages
of n basic blocks with 16/32/64 channels (stride 2 at the start of stages 2 and 3), global average
pooling and a linear classifier. Shortcuts are option A (as in the paper's CIFAR experiments):
identity, and where the shape changes a parameter-free stride-2 subsampling with zero-padded channels.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


class _BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.stride = stride
        self.pad = channels - in_channels

    def shortcut(self, x: torch.Tensor) -> torch.Tensor:
        """Option A: subsample by the stride, zero-pad the new channels."""
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, 0, self.pad))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 input."""

    def __init__(self, n: int, num_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        blocks = []
        in_channels = 16
        for stage, channels in enumerate((16, 32, 64)):
            for i in range(n):
                blocks.append(_BasicBlock(in_channels, channels, 2 if stage > 0 and i == 0 else 1))
                in_channels = channels
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(64, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.bn(self.conv(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str, num_classes: int) -> nn.Module:
    """A freshly initialised model (uses the global torch RNG: seed it first)."""
    if name == "resnet44":
        return CifarResNet(n=7, num_classes=num_classes)
    # No weights argument: torchvision's default is random init (weights=None / pretrained=False).
    return getattr(torchvision.models, name)(num_classes=num_classes)
