"""Transcoders on every layer of one model: the replacement of each MLP by sparse features.

Shape letters: N any leading axes (batch, pos), E d_model, F d_transcoder (features per layer),
L n_layers, O the layers a layer's features write to (1 for a per-layer set).

A per-layer transcoder set (PLT; Dunefsky et al. 2024, "Transcoders Find Interpretable LLM Feature
Circuits") has one transcoder per layer l, reading the MLP's input x_l and predicting its output:

    f_l  = sigma(x_l W_enc^l + b_enc^l)                                   [N, F]
    y^_l = f_l W_dec^l + b_dec^l  (+ x_l W_skip^l, a skip transcoder)     [N, E]

A cross-layer transcoder (CLT; Ameisen et al. 2025, "Circuit Tracing") reads each layer the same way,
but the features of layer l write to every layer l' >= l, with a decoder row for each:

    y^_l' = sum_{l <= l'} f_l W_dec^{l -> l'} + b_dec^l'  (+ x_l' W_skip^l')

Each layer's features are an anatomy SAE (modules.py: encoding, the kinds, splicing), which writes
the outputs of the layers it reaches side by side: W_dec [F, O E] is viewed as [F, O, E], and its
b_dec (and W_skip) are non-zero in the first block only (the layer's own output), so that each
bias is added once. O = 1 for a PLT, L - l for a CLT: decoder_vectors(l) is [F, O, E] either way.

The points, by default the MLP's input and output (`blocks.L.mlp_norm.out` -> `blocks.L.mlp.out`),
are anatomy's trace points; circuit-tracer's and TransformerLens's names map to them through
anatomy/hook_names.py. `check_fits(model)` refuses, in one line naming the field and the allowed
values, a set whose layer count, widths or points do not fit the model, before any computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from ..hook_names import anatomy_name
from ..trace import trace_points
from .modules import SAE
from .transcoder_layers import LayerSpec, LazyLayers

INPUT_POINT, OUTPUT_POINT = "blocks.L.mlp_norm.out", "blocks.L.mlp.out"


class TranscoderSet(nn.Module):
    """Transcoders for every layer of one model: `layers[l]` the SAE of layer l's features.

    layers: one transcoder SAE per layer, all of one kind and width; a PLT's write d_model, a CLT's
    layer l writes (n_layers - l) d_model (see the module docstring); or a LazyLayers (transcoder_layers.py:
    what load_transcoders gives), whose layers are read from their files when first used. cross_layer: a
    CLT. input_point, output_point: the points each layer reads and writes, with L for the layer
    (TransformerLens names accepted). metadata: what the files said (model name, scan), written back.
    Raises ValueError, before anything is computed, for layers that disagree in kind, width or shape.
    """

    def __init__(self, layers: Sequence[SAE] | LazyLayers, *, cross_layer: bool = False,
                 input_point: str = INPUT_POINT, output_point: str = OUTPUT_POINT, metadata: dict | None = None):
        super().__init__()
        lazy = isinstance(layers, LazyLayers)
        if not lazy and (not isinstance(layers, (Sequence, nn.ModuleList)) or not all(isinstance(sae, SAE) for sae in layers)):
            raise ValueError("a transcoder set's layers are a sequence of SAEs (anatomy.sae.SAE), one per layer")
        if not layers:
            raise ValueError("a transcoder set needs one transcoder per layer; got none")
        specs = layers.specs if lazy else [LayerSpec.of(sae) for sae in layers]
        first = specs[0]
        n_layers, d_model = len(specs), first.d_in
        for layer, spec in enumerate(specs):
            writes = (n_layers - layer) * d_model if cross_layer else d_model
            for field, value, allowed in (("kind", spec.kind, first.kind), ("d_sae", spec.d_sae, first.d_sae),
                                          ("d_in", spec.d_in, d_model), ("d_out", spec.d_out, writes),
                                          ("skip", spec.skip, first.skip)):
                if value != allowed:
                    raise ValueError(f"transcoder set: layer {layer} has {field}={value!r}; allowed: {allowed!r} "
                                     f"(as layer 0{', and n_layers - layer blocks of d_model for a CLT' if field == 'd_out' else ''})")
            if cross_layer and not lazy and any(t is not None and t.detach()[d_model:].any()
                                                for t in (layers[layer].b_dec, layers[layer].W_skip)):
                raise ValueError(f"transcoder set: layer {layer} of a CLT has b_dec or W_skip beyond its own output's "
                                 f"first {d_model}; allowed: zeros there (each layer's bias and skip are added once)")
        self.layers = layers if lazy else nn.ModuleList(layers)
        self.n_layers, self.d_model, self.d_transcoder = n_layers, d_model, first.d_sae
        self.kind, self.cross_layer, self.has_skip = first.kind, cross_layer, first.skip
        self.input_pattern = _layer_pattern(input_point)
        self.output_pattern = _layer_pattern(output_point)
        self.metadata = dict(metadata or {})
        if lazy:
            layers.prepare = self._name_points
        else:
            for layer, sae in enumerate(self.layers):
                self._name_points(layer, sae)

    def _name_points(self, layer: int, sae: SAE) -> None:
        """Each transcoder names the points of its own layer."""
        sae.point, sae.point_out, sae.is_transcoder = self.input_point(layer), self.output_point(layer), True

    @property
    def lazy(self) -> bool:
        """Whether the layers are read from files when first used (LazyLayers), rather than held."""
        return isinstance(self.layers, LazyLayers)

    def release(self, layer: int | None = None) -> None:
        """A lazy set lets go of one built layer (or of all): their memory returns; the next use reads it
        again. Nothing for a set held in memory."""
        if self.lazy:
            self.layers.release(None if layer is None else self._layer(layer))

    def _apply(self, fn, recurse: bool = True):
        if self.lazy:  # .to(device), .float(): done to the layers built, and to each one built later
            self.layers.apply(fn)
        return super()._apply(fn, recurse)

    def train(self, mode: bool = True):
        if self.lazy:
            self.layers.train(mode)
        return super().train(mode)

    # ---- where the features live ----------------------------------------------------------------
    def input_point(self, layer: int) -> str:
        """The trace point layer `layer`'s transcoder reads (blocks.3.mlp_norm.out)."""
        return self.input_pattern.replace("L", str(self._layer(layer)), 1)

    def output_point(self, layer: int) -> str:
        """The trace point whose value layer `layer`'s reconstruction replaces (blocks.3.mlp.out)."""
        return self.output_pattern.replace("L", str(self._layer(layer)), 1)

    def writers(self, layer: int) -> range:
        """The layers whose features write to `layer`'s output: itself (PLT), or 0 .. layer (CLT)."""
        layer = self._layer(layer)
        return range(0, layer + 1) if self.cross_layer else range(layer, layer + 1)

    # ---- the equations ----------------------------------------------------------------------------
    def pre_activations(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, F]: x W_enc^l + b_enc^l, layer l's features before the activation."""
        return self.layers[self._layer(layer)].pre_activations(x)

    def activate(self, layer: int, pre: torch.Tensor) -> torch.Tensor:
        """[N, F] -> [N, F]: sigma(pre), layer l's activation function (ReLU, JumpReLU, TopK, BatchTopK)."""
        return self.layers[self._layer(layer)].activate(pre)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """[N, E] -> [N, F]: layer l's feature activations f_l = sigma(pre_activations(l, x))."""
        return self.activate(layer, self.pre_activations(layer, x))

    def decoder_vectors(self, layer: int) -> torch.Tensor:
        """[F, O, E]: the rows layer l's features write to layers l .. l + O - 1 (O = 1 for a PLT,
        n_layers - l for a CLT): decoder_vectors(l)[i, j] is what one unit of feature i adds to layer l + j's
        output. A view of the parameters (no copy)."""
        sae = self.layers[self._layer(layer)]
        return sae.W_dec.view(self.d_transcoder, -1, self.d_model)  # (F, O E) -> (F, O, E)

    def output_bias(self, layer: int) -> torch.Tensor:
        """[E]: b_dec^l, the bias of layer l's reconstruction (added once, whichever features write there)."""
        return self.layers[self._layer(layer)].b_dec[:self.d_model]

    def skip(self, layer: int) -> torch.Tensor | None:
        """[E_in, E_out] or None: a skip transcoder's linear path, oriented so that it adds x_l @ skip(l)
        to layer l's output (the transpose of the W_skip [E_out, E_in] that SAELens and circuit-tracer
        store). A view of the parameters (no copy)."""
        W_skip = self.layers[self._layer(layer)].W_skip
        return None if W_skip is None else W_skip[:self.d_model].T

    def reconstruct(self, layer: int, features: Sequence[torch.Tensor | None],
                    inputs: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        """[N, E]: y^_l, layer l's MLP output as the set writes it,

            y^_l = sum over l' in writers(l) of f_l' decoder_vectors(l')[:, l - l'] + output_bias(l) (+ x_l skip(l))

        features[l']: [N, F], the activations of layer l' (only those of writers(l) are read); inputs[l]:
        [N, E], layer l's input, needed by a skip transcoder alone. Raises ValueError for a missing one."""
        layer = self._layer(layer)
        total = self.output_bias(layer)
        for source in self.writers(layer):
            if source >= len(features) or features[source] is None:
                raise ValueError(f"reconstructing layer {layer} needs the features of layers {list(self.writers(layer))}; "
                                 f"layer {source}'s are missing")
            total = total + features[source] @ self.decoder_vectors(source)[:, layer - source]  # (N, F) (F, E)
        skip = self.skip(layer)
        if skip is not None:
            if inputs is None or layer >= len(inputs) or inputs[layer] is None:
                raise ValueError(f"a skip transcoder reconstructs layer {layer} from its input: give inputs[{layer}]")
            total = total + inputs[layer].to(skip.dtype) @ skip
        return total

    # ---- fitting a model --------------------------------------------------------------------------
    def check_fits(self, model: nn.Module) -> None:
        """Raise ValueError, in one line naming the field and the allowed values, when this set does not fit
        `model`: its layer count, the points it reads and writes, or their widths (from the points' axes and
        the model's config). Nothing is computed."""
        blocks = getattr(model, "blocks", None)
        if blocks is None or getattr(model.config, "arch", None) == "encoder-decoder":
            raise ValueError("transcoders attach to a decoder or an encoder with blocks.L; this model has none")
        if self.n_layers != len(blocks):
            raise ValueError(f"transcoder set n_layers={self.n_layers} does not fit this model; allowed: {len(blocks)} "
                             "(one transcoder for each of its blocks)")
        points = trace_points(model)
        for field, pattern in (("input point", self.input_pattern), ("output point", self.output_pattern)):
            missing = [layer for layer in range(self.n_layers) if pattern.replace("L", str(layer), 1) not in points]
            if missing:
                block = sorted({n.split(".", 2)[2] for n in points if n.startswith("blocks.0.")})
                raise ValueError(f"transcoder set {field} {pattern!r} is not in block {missing[0]} of this model; allowed: "
                                 f"blocks.L.{{{', '.join(block)}}}")
            if field == "output point" and self.metadata.get("feature_output_hook") == "hook_mlp_out" and \
                    pattern == OUTPUT_POINT and "blocks.0.mlp_out_norm.out" in points:
                raise ValueError("transcoder set output point: circuit-tracer's hook_mlp_out is, in this model, the output "
                                 "of the MLP's own norm; allowed: blocks.L.mlp_out_norm.out (load_transcoders(..., "
                                 "mlp_out_norm=True))")
            width = _width(points[pattern.replace("L", "0", 1)], model.config)
            if width is not None and width != self.d_model:
                raise ValueError(f"transcoder set d_model={self.d_model} does not fit the {field} {pattern!r} of this model, "
                                 f"of width {width}; allowed: {width}")

    def saes(self) -> dict[str, SAE]:
        """{output point: transcoder} of a per-layer set, for anatomy.trace(model, saes=...): each MLP spliced
        as its reconstruction plus error, with `<point>.sae.features` to record or intervene on. Raises
        ValueError for a CLT, whose layers write to more than one point."""
        if self.cross_layer:
            raise ValueError("a cross-layer transcoder's features write to every later layer: splice it with "
                             "TranscoderSet.replacement(), not one SAE per point")
        return {self.output_point(layer): self.layers[layer] for layer in range(self.n_layers)}

    def replacement(self, where: Callable[[torch.Tensor], torch.Tensor] | None = None, errors: bool = False
                    ) -> dict[str, Callable]:
        """Interventions for anatomy.trace(model, interventions=...) that run the replacement model: each
        layer's input is encoded as it is reached, and each MLP output y_l is replaced by y^_l =
        reconstruct(l, ...), the features of every layer that writes to it (a CLT's earlier layers included);
        with `errors`, by y^_l + (y_l - y^_l), the error term added back (the model's own value, to rounding).

        where(x [B, T, E]) -> [B, T] bool: the positions replaced, from the model's own output there
        (default all); elsewhere the model's value goes on. The dict keeps the features of the pass it is
        used in. Raises ValueError (from the pass) when a layer's output is reached before its input."""
        features: list[torch.Tensor | None] = [None] * self.n_layers
        inputs: list[torch.Tensor | None] = [None] * self.n_layers

        def read(layer: int):
            def fn(x: torch.Tensor) -> None:
                inputs[layer] = x
                features[layer] = self.encode(layer, x)
            return fn

        def write(layer: int):
            def fn(x: torch.Tensor) -> torch.Tensor:
                if inputs[layer] is None:
                    raise ValueError(f"layer {layer}'s output {self.output_point(layer)!r} was reached before its input")
                recon = self.reconstruct(layer, features, inputs).to(x.dtype)
                if errors:
                    recon = recon + (x - recon)  # y^ + e
                return recon if where is None else torch.where(where(x)[..., None], recon, x)
            return fn

        interventions = {}
        for layer in range(self.n_layers):
            interventions[self.input_point(layer)] = read(layer)
            interventions[self.output_point(layer)] = write(layer)
        return interventions

    def _layer(self, layer) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer < self.n_layers:
            raise ValueError(f"layer must be an integer in [0, n_layers={self.n_layers}), got {layer!r}")
        return layer

    def extra_repr(self) -> str:
        skip = ", skip" if self.has_skip else ""
        return (f"{'CLT' if self.cross_layer else 'PLT'}, kind={self.kind!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"d_transcoder={self.d_transcoder}{skip}, {self.input_pattern} -> {self.output_pattern}")


def mlp_points(model: nn.Module) -> tuple[str, str]:
    """(the point each block's MLP reads, the point it writes), with L for the layer, from the block's layout:
    the MLP's own norm (pre-norm and sandwich blocks: blocks.L.mlp_norm.out), the attention's norm (a parallel
    block that shares it, GPT-J), or the residual stream itself (post-norm blocks: blocks.L.resid_mid)."""
    config = model.config
    if config.parallel_residual:
        reads = "blocks.L.attn_norm.out" if config.parallel_shared_norm else "blocks.L.mlp_norm.out"
    elif config.norm_position in ("post", "post_sublayer"):
        reads = "blocks.L.resid_mid"
    else:
        reads = "blocks.L.mlp_norm.out"
    return reads, OUTPUT_POINT


def points_of(input_point: str, output_point: str, n_layers: int) -> list[str]:
    """[in_0, out_0, in_1, out_1, ...]: the points of every layer's transcoder (L for the layer in each), in the
    order a harvested row holds them."""
    return [p.replace("L", str(layer), 1) for layer in range(n_layers) for p in (input_point, output_point)]


def _layer_pattern(point: str) -> str:
    """A point with L for the layer (blocks.L.mlp.out), its TransformerLens spelling read as anatomy's."""
    name = anatomy_name(point.replace(".L.", ".0.", 1)).replace(".0.", ".L.", 1)
    if not name.startswith("blocks.L."):
        raise ValueError(f"a transcoder set's point names its layer as blocks.L.<point>; got {point!r}")
    return name


def _width(point, config) -> int | None:
    """The width of a point's last axes from its axis names and the model's config (None when unknown)."""
    sizes = {"d_model": config.d_model, "d_ff": config.d_ff}
    axes = [axis for axis in point.axes if axis not in ("batch", "pos")]
    if not axes or any(axis not in sizes for axis in axes):
        return None
    width = 1
    for axis in axes:
        width *= sizes[axis]
    return width
