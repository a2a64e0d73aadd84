"""The toy model and input shared by the trace tests."""

import torch

from anatomy import build_model, preset

IDS = torch.tensor([[1, 3, 4, 6, 5, 2, 0]])  # Armas (2024): <SOS> Hello World, this is Alejandro! <EOS>
TARGET = torch.tensor([[1, 3, 4, 6, 5]])


def model_of(**overrides):
    return build_model(preset("toy", **overrides), seed=0).eval()


def run(model):
    if model.config.arch == "encoder-decoder":
        return model(IDS, TARGET)
    return model(IDS)
