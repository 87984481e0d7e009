"""ResNet-44 (CIFAR layout, option-A shortcuts, as dlaunch/train/models.py) and ResNet-50 (Keras applications,
random init) in Keras 2, channels-last."""

import tf_keras as keras
from tf_keras import layers


def _basic_block(x, channels: int, stride: int):
    out = layers.Conv2D(channels, 3, strides=stride, padding="same", use_bias=False, kernel_initializer="he_normal")(x)
    out = layers.ReLU()(layers.BatchNormalization(epsilon=1e-5, momentum=0.9)(out))
    out = layers.Conv2D(channels, 3, padding="same", use_bias=False, kernel_initializer="he_normal")(out)
    out = layers.BatchNormalization(epsilon=1e-5, momentum=0.9)(out)
    shortcut = x
    if stride != 1:
        shortcut = layers.Lambda(lambda t: t[:, ::stride, ::stride, :])(shortcut)
    pad = channels - x.shape[-1]
    if pad:
        shortcut = layers.Lambda(
            lambda t: keras.backend.concatenate([t, keras.backend.zeros_like(t[..., :pad])], axis=-1)
        )(shortcut)
    return layers.ReLU()(layers.Add()([out, shortcut]))


def resnet44(num_classes: int, image_size: int) -> keras.Model:
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False, kernel_initializer="he_normal")(inputs)
    x = layers.ReLU()(layers.BatchNormalization(epsilon=1e-5, momentum=0.9)(x))
    for stage, channels in enumerate((16, 32, 64)):
        for i in range(7):
            x = _basic_block(x, channels, 2 if stage > 0 and i == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(num_classes)(x), name="resnet44")


def build_model(name: str, num_classes: int, image_size: int) -> keras.Model:
    """Logits (no softmax)."""
    if name == "resnet44":
        return resnet44(num_classes, image_size)
    return keras.applications.ResNet50(
        weights=None, input_shape=(image_size, image_size, 3), classes=num_classes, classifier_activation=None
    )
