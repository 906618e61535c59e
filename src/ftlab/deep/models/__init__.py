"""Small models written in plain torch (no torchvision/timm): ResNet, ViT, Transformer.

* :mod:`ftlab.deep.models.resnet` -- CIFAR-style ResNet-18, width configurable.
* :mod:`ftlab.deep.models.transformer` -- a LayerNorm-free Transformer for modular arithmetic.
* :mod:`ftlab.deep.models.vit` -- a small ViT (import it from its module).
"""

from ftlab.deep.models.resnet import ResNet18, resnet18
from ftlab.deep.models.transformer import ModularTransformer, modular_transformer

__all__ = ["ResNet18", "resnet18", "ModularTransformer", "modular_transformer"]
