"""Small models written in plain torch (no torchvision/timm): ResNet, ViT, Transformer.

* :mod:`ftlab.models.resnet` -- CIFAR-style ResNet-18, width configurable.
* :mod:`ftlab.models.cnn` -- the same ResNet-18 without normalization and biases (exact rescales).
* :mod:`ftlab.models.transformer` -- a LayerNorm-free Transformer for modular arithmetic.
* :mod:`ftlab.models.vit` -- a small ViT (import it from its module).
* :mod:`ftlab.models.efficientnet` -- EfficientNet-Lite0/1/2, loading the pip-packaged ImageNet weights strictly.
"""

from ftlab.models.resnet import ResNet18, resnet18
from ftlab.models.transformer import ModularTransformer, modular_transformer

__all__ = ["ResNet18", "resnet18", "ModularTransformer", "modular_transformer"]
