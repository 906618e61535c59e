"""Small models written in plain torch (no torchvision/timm): ResNet, ViT, Transformer."""
