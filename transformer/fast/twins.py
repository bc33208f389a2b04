"""``speed_up(model)``: the model's modules replaced by their fast twins, the same parameters and the same
function (each twin is a subclass that only overrides how a step is computed):

    nn.Dropout          -> dropout.Dropout                  a cheaper random mask on the CPU
    FeedForward         -> layers.FastFeedForward           ReLU and dropout with one mask
    MultiHeadAttention  -> attention.FastMultiHeadAttention beams share a memory; one-copy cache appends

A model is sped up where it is built, before an optimizer takes its parameters; state dicts, checkpoints
and the plain model's tests are unchanged by it.
"""

from torch import nn

from transformer.core.attention import MultiHeadAttention
from transformer.core.layers import FeedForward
from transformer.core.model import Transformer
from transformer.fast.attention import FastMultiHeadAttention
from transformer.fast.dropout import Dropout
from transformer.fast.layers import FastFeedForward

TWINS = {MultiHeadAttention: FastMultiHeadAttention, FeedForward: FastFeedForward}


def twin(module: nn.Module, cls: type) -> nn.Module:
    """A module of class ``cls`` (a subclass of ``module``'s) holding ``module``'s parameters, buffers,
    submodules and settings: the same object graph, another ``forward``."""
    new = cls.__new__(cls)
    new.__dict__.update(module.__dict__)
    new._modules = dict(module._modules)  # its own table: swapping a child of one leaves the other
    return new


def speed_up(model: Transformer) -> Transformer:
    """``model`` with each module replaced by its fast twin (the module docstring's table), in place."""
    for parent in list(model.modules()):  # the dropouts first, while every parent is in the list
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:
                setattr(parent, name, Dropout(child.p).train(child.training))
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in TWINS:
                setattr(parent, name, twin(child, TWINS[type(child)]))
    return model
