"""Where each node of an attribution graph sits: the active features, and the order of the nodes.

Shape letters: T positions, F transcoder features, n active features.

    nodes:  tokens [T] | layer 0: its features, its errors [T] | ... | layer L-1: ... | logits

The features of a layer are ordered by position, then by feature index (Active's order), so that the
features of one (layer, position) are one contiguous slice of the node list and of Active's arrays.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Active:
    """The active features of every layer (position 0 left out), in (layer, position, feature) order."""

    layer: torch.Tensor  # [n] long
    position: torch.Tensor  # [n] long
    feature: torch.Tensor  # [n] long
    activation: torch.Tensor  # [n]
    pre_activation: torch.Tensor  # [n]: each one's pre-activation (a target's value)

    def span(self, layer: int) -> tuple[int, int]:
        """(start, stop): where layer's features sit in these arrays."""
        start, stop = torch.searchsorted(self.layer, torch.tensor([layer, layer + 1], device=self.layer.device)).tolist()
        return start, stop


@dataclass
class Layout:
    """Where each node sits in the graph's node order: tokens, then per layer its features and its errors
    (one per position, the first one included, as circuit-tracer numbers them), then the logits."""

    n_tokens: int
    feature_start: list[int]  # per layer: the node index of its first feature
    error_start: list[int]  # per layer: the node index of position 0's error
    active_start: list[int]  # per layer: the index of its first feature in Active's arrays
    feature_offsets: list[torch.Tensor]  # per layer [T + 1]: where each position's features begin, from its first
    logit_start: int
    total: int

    def features(self, layer: int, position: int) -> tuple[slice, slice]:
        """(node indices, indices into Active's arrays) of layer's features at position."""
        lo, hi = int(self.feature_offsets[layer][position]), int(self.feature_offsets[layer][position + 1])
        return (slice(self.feature_start[layer] + lo, self.feature_start[layer] + hi),
                slice(self.active_start[layer] + lo, self.active_start[layer] + hi))


def layout(active: Active, n_layers: int, T: int, n_logits: int) -> Layout:
    """The node order of a graph with these active features over T positions and n_logits logit targets."""
    feature_start, error_start, active_start, offsets = [], [], [], []
    index, count = T, 0
    for layer in range(n_layers):
        counts = torch.bincount(active.position[active.layer == layer].cpu(), minlength=T)  # bookkeeping: on the CPU
        feature_start.append(index)
        active_start.append(count)
        offsets.append(torch.cat([torch.zeros(1, dtype=torch.long, device="cpu"), counts.cumsum(0)]))
        index += int(counts.sum())
        count += int(counts.sum())
        error_start.append(index)
        index += T
    return Layout(T, feature_start, error_start, active_start, offsets, index, index + n_logits)
