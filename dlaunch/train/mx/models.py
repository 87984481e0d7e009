"""ResNet-44 (CIFAR layout, option-A shortcuts, as dlaunch/train/models.py) and ResNet-50 (Gluon model zoo v1,
random init), Gluon hybrid blocks, NCHW."""

import mxnet as mx
from mxnet import gluon
from mxnet.gluon import nn


class BasicBlock(gluon.HybridBlock):
    def __init__(self, channels: int, stride: int, pad: int, **kwargs):
        super().__init__(**kwargs)
        self.stride, self.pad = stride, pad
        with self.name_scope():
            self.body = nn.HybridSequential()
            self.body.add(
                nn.Conv2D(channels, 3, stride, 1, use_bias=False),
                nn.BatchNorm(momentum=0.9, epsilon=1e-5),
                nn.Activation("relu"),
                nn.Conv2D(channels, 3, 1, 1, use_bias=False),
                nn.BatchNorm(momentum=0.9, epsilon=1e-5),
            )

    def hybrid_forward(self, F, x):
        shortcut = x
        if self.stride != 1:
            shortcut = F.slice(
                shortcut,
                begin=(None, None, None, None),
                end=(None, None, None, None),
                step=(1, 1, self.stride, self.stride),
            )
        if self.pad:
            shortcut = F.concat(shortcut, F.zeros_like(shortcut), dim=1)  # pad == the input's channels here
        return F.relu(self.body(x) + shortcut)


def resnet44(num_classes: int) -> gluon.HybridBlock:
    net = nn.HybridSequential(prefix="resnet44_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, 1, 1, use_bias=False), nn.BatchNorm(momentum=0.9, epsilon=1e-5), nn.Activation("relu"))
        in_channels = 16
        for stage, channels in enumerate((16, 32, 64)):
            for i in range(7):
                net.add(BasicBlock(channels, 2 if stage > 0 and i == 0 else 1, channels - in_channels))
                in_channels = channels
        # Glorot-initialised classifier (as Keras; the MSRA init of the convolutions would make the first logits large).
        net.add(nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(num_classes, weight_initializer=mx.init.Xavier()))
    return net


def build_model(name: str, num_classes: int) -> gluon.HybridBlock:
    """Logits (no softmax)."""
    if name == "resnet44":
        return resnet44(num_classes)
    return gluon.model_zoo.vision.resnet50_v1(classes=num_classes)
