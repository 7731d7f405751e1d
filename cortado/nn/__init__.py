"""``cortado.nn``: layers with hierarchical parameter names and PyTorch's initialisers, and losses, as plain
expressions that the engine rewrites, differentiates and plans like any other.

    model = nn.MLP(784, 256, 10)
    logits = model(x)                                  # names the parameters: 0.weight, 0.bias, 2.weight, 2.bias
    loss = nn.cross_entropy(logits, labels)
    params = model.parameters()                        # {name: variable}
    state = model.initial_values(seed=0)               # {variable: array}
"""

from . import init
from .activations import GELU, Identity, LogSoftmax, ReLU, Sigmoid, SiLU, Softmax, Tanh
from .attention import CausalSelfAttention
from .layers import MLP, BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Embedding, LayerNorm, Linear, RMSNorm
from .losses import binary_cross_entropy_with_logits, cross_entropy, mse_loss
from .module import Buffer, Function, Module, ModuleList, Parameter, Sequential
from .pooling import AvgPool2d, Flatten, MaxPool2d

__all__ = [
    "Module", "Parameter", "Buffer", "Sequential", "ModuleList", "Function", "Linear", "Embedding", "LayerNorm",
    "RMSNorm", "Conv2d", "BatchNorm", "Dropout", "MLP", "CausalSelfAttention", "cross_entropy",
    "binary_cross_entropy_with_logits", "mse_loss", "init", "ReLU", "GELU", "SiLU", "Sigmoid", "Tanh", "MaxPool2d",
    "AvgPool2d", "Flatten", "BatchNorm1d", "BatchNorm2d", "Identity", "Softmax", "LogSoftmax",
]
