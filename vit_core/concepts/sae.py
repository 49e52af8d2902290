"""The TopK sparse autoencoder (Gao et al. 2024, "Scaling and evaluating sparse autoencoders"), its token
normalisation, its training and its file.

Definitions (docs/spec/analyses.md, "Concepts"). A token x (D,) of the residual stream is first normalised,
x_n = (x - mu) / s, with mu (D,) the mean of the training tokens and s the scalar that gives them a mean squared norm
of D (s^2 = mean ||x - mu||^2 / D): the same autoencoder settings then suit every model and layer. Then

    z     = ReLU(TopK_k(W_enc (x_n - b_pre) + b_enc))     (F,): k non-zero entries at most
    x_n^  = W_dec z + b_pre                               (D,)
    x^    = s x_n^ + mu                                   (D,): the reconstruction in the model's units

with W_dec (D, F) of unit-norm columns (feature f's direction d_f), b_pre the pre-encoder bias subtracted before
the encoder and added back after the decoder. Training minimises the normalised squared error ||x_n - x_n^||^2 / D
plus 1/32 of the AuxK loss: the residual e = x_n - x_n^ reconstructed by the k_aux most active *dead* features (no
firing over the last `dead_after` training tokens), so that dead features get a gradient towards what the live ones
miss. Adam, with the decoder's columns renormalised after every step and the gradient's component along each
column removed before it.

Shapes: N tokens, D width, F features, k active features per token.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import ViTLensError

FORMAT = "vit-lens concepts 1"
NORMALISATION = "x_n = (x - mean) / scale, mean: the training tokens' mean, scale: sqrt(mean ||x - mean||^2 / D)"
AUXK_COEFFICIENT = 1 / 32  # Gao et al. 2024, section 2.4


class ConceptsError(ViTLensError, ValueError):
    """A concepts file that can't be used (damaged, another model's, another format), or settings that can't train."""


@dataclass(frozen=True)
class Normalisation:
    """x_n = (x - mean) / scale."""

    mean: np.ndarray  # float32 (D,)
    scale: float

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return (x - torch.as_tensor(self.mean, device=x.device)) / self.scale  # (N, D) -> (N, D)

    def undo(self, x_n: torch.Tensor) -> torch.Tensor:
        return x_n * self.scale + torch.as_tensor(self.mean, device=x_n.device)  # (N, D) -> (N, D)


def normalisation_of(chunks: Iterable[np.ndarray]) -> Normalisation:
    """The normalisation of the tokens in `chunks` (each (n, D)), in float64 over two passes: mean, then spread."""
    chunks = list(chunks)
    count = sum(len(c) for c in chunks)
    if count == 0:
        raise ConceptsError("There are no tokens to learn concepts from.")
    mean = sum(c.sum(axis=0, dtype=np.float64) for c in chunks) / count  # (D,)
    squares = sum(float(((c.astype(np.float64) - mean) ** 2).sum()) for c in chunks)
    scale = math.sqrt(squares / count / len(mean)) or 1.0  # all tokens equal: nothing to scale
    return Normalisation(mean.astype(np.float32), float(scale))


class TopKSAE(torch.nn.Module):
    """The autoencoder's parameters and its two halves (shapes in the module docstring)."""

    def __init__(self, d_model: int, num_features: int, k: int) -> None:
        super().__init__()
        if not 1 <= k <= num_features:
            raise ConceptsError(f"k = {k} active features of {num_features}: k must be from 1 to the feature count.")
        self.k = k
        self.W_enc = torch.nn.Parameter(torch.zeros(num_features, d_model))  # (F, D)
        self.b_enc = torch.nn.Parameter(torch.zeros(num_features))  # (F,)
        # W_dec (D, F) is kept as its transpose, one row per feature: training's sparse decoder (embedding_bag) reads
        # and writes rows of a contiguous parameter 6x faster than columns of a transposed view (0.03 s against 0.2 s
        # per step at F = 2,048, k = 32 on 2 cores)
        self.decoder = torch.nn.Parameter(torch.zeros(num_features, d_model))  # (F, D): unit-norm rows d_f
        self.b_pre = torch.nn.Parameter(torch.zeros(d_model))  # (D,)

    @property
    def W_dec(self) -> torch.Tensor:
        return self.decoder.T  # (F, D) -> (D, F): a view, writable in place

    @property
    def num_features(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_model(self) -> int:
        return self.W_enc.shape[1]

    def pre_activations(self, x_n: torch.Tensor) -> torch.Tensor:
        return (x_n - self.b_pre) @ self.W_enc.T + self.b_enc  # (N, D) -> (N, F)

    def encode(self, x_n: torch.Tensor) -> torch.Tensor:
        """Sparse codes z (N, F): the k largest pre-activations of each token, ReLU'd, the others 0."""
        return topk_codes(self.pre_activations(x_n), self.k)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.decoder + self.b_pre  # (N, F) -> (N, D)

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        self.decoder.div_(self.decoder.norm(dim=1, keepdim=True).clamp_min(1e-12))

    @torch.no_grad()
    def project_decoder_gradient(self) -> None:
        """Removes the part of each column's gradient along the column: a step then turns the direction, not its norm."""
        if self.decoder.grad is not None:
            along = (self.decoder.grad * self.decoder).sum(dim=1, keepdim=True)  # (F, 1)
            self.decoder.grad.sub_(along * self.decoder)


def topk_codes(pre: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest entries of each row of `pre` (N, F), ReLU'd, scattered into zeros: (N, F)."""
    values, indices = pre.topk(k, dim=-1)  # (N, k), (N, k)
    return torch.zeros_like(pre).scatter(-1, indices, F.relu(values))


def sparse_decode(sae: TopKSAE, values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """W_dec z for a z given by its non-zero `values` (B, k) at `indices` (B, k), without the bias: (B, D). The same
    as the dense product, at k instead of F multiply-adds per output (training's decoder and its gradient: a third
    of a dense step's work at F = 2,048, k = 32)."""
    return F.embedding_bag(indices, sae.decoder, per_sample_weights=values, mode="sum")


class _ChosenPreActivations(torch.autograd.Function):
    """The pre-activations of chosen features, already computed densely, with a gradient that visits only them: for
    g (B, m) the gradient at `indices` (B, m), the centred tokens' gradient is sum_j g_bj w_{f_bj} (an embedding bag of
    the encoder's rows) and the encoder's is sum over (b, j) with f_bj = f of g_bj x_b (a sparse (F, B) matrix times
    the tokens), at m instead of F multiply-adds per token (the dense product's gradient is zero everywhere else)."""

    @staticmethod
    def forward(ctx, centred: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, indices: torch.Tensor,
                values: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(centred, weight, indices)
        return values.clone()  # (B, m): the dense product's own values, so the forward is the same bits

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # g (B, m)
        centred, weight, indices = ctx.saved_tensors
        b, m = indices.shape
        g = g.contiguous()
        centred_gradient = F.embedding_bag(indices, weight.detach(), per_sample_weights=g, mode="sum")  # (B, D)
        tokens = torch.arange(b).repeat_interleave(m)  # (B m,): each entry's token
        sparse = torch.sparse_coo_tensor(torch.stack([indices.reshape(-1), tokens]), g.reshape(-1), (weight.shape[0], b),
                                         check_invariants=False)  # (F, B): built from topk's indices, valid
        weight_gradient = torch.sparse.mm(sparse, centred.detach())  # (F, B) sparse @ (B, D) -> (F, D)
        bias_gradient = torch.zeros(weight.shape[0], dtype=g.dtype).index_add_(0, indices.reshape(-1), g.reshape(-1))
        return centred_gradient, weight_gradient, bias_gradient, None, None


def chosen_pre_activations(sae: TopKSAE, centred: torch.Tensor, pre: torch.Tensor, indices: torch.Tensor
                           ) -> torch.Tensor:
    """pre (B, F) (no gradient) at `indices` (B, m), with the gradient of W_enc (x_n - b_pre) + b_enc for those
    entries alone, to b_pre through `centred` = x_n - b_pre (B, D), W_enc and b_enc: (B, m)."""
    return _ChosenPreActivations.apply(centred, sae.W_enc, sae.b_enc, indices, pre.gather(-1, indices))


def initialised_sae(d_model: int, num_features: int, k: int, seed: int) -> TopKSAE:
    """Random unit-norm decoder columns, the encoder their transpose (Gao et al.'s tied initialisation), biases 0
    (b_pre 0 is the training tokens' normalised mean: the normalisation centres them)."""
    sae = TopKSAE(d_model, num_features, k)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        sae.W_dec.copy_(torch.randn(d_model, num_features, generator=generator))
        sae.normalise_decoder()
        sae.W_enc.copy_(sae.W_dec.T)
    return sae


RATE_STEPS = 8192  # S_0: the run length (Adam steps) from which on Gao et al.'s rate is used as it is (analyses.md)
RATE_FACTOR = 4.0  # at most 4 x Gao et al.'s rate: the largest factor measured (docs/performance.md, "Concepts")
DECAY = 0.2  # the rate falls linearly to 0 over the last fifth of the steps (analyses.md)
DEAD_FIRINGS = 20  # a feature is dead after the tokens in which an average one fires 20 times (analyses.md)


@dataclass(frozen=True)
class TrainingSettings:
    num_features: int
    k: int
    epochs: int = 4
    batch_tokens: int = 1024
    learning_rate: float | None = None  # default: the rule of `lr`
    seed: int = 0
    k_aux: int | None = None  # default: D / 2, as Gao et al.
    dead_after: int | None = None  # default: the rule of `dead_window`
    rate_steps: int = RATE_STEPS
    dead_firings: float = DEAD_FIRINGS
    decay: float = DECAY  # the last share of the steps over which the rate falls linearly to 0

    def steps(self, train_tokens: int) -> float:
        """S, the run's Adam steps: E epochs of the training tokens in batches of B."""
        return self.epochs * train_tokens / self.batch_tokens

    def lr(self, train_tokens: int) -> float:
        """The peak rate: --lr, else Gao et al.'s 2e-4 / sqrt(F / 2^14) times sqrt(S_0 / S), between 1 and
        RATE_FACTOR (docs/spec/analyses.md, "Training"): a run of fewer steps S takes larger ones."""
        if self.learning_rate:
            return self.learning_rate
        base = 2e-4 / math.sqrt(self.num_features / 2 ** 14)
        return base * min(RATE_FACTOR, math.sqrt(max(1.0, self.rate_steps / max(self.steps(train_tokens), 1e-9))))

    def rate_at(self, step: int, train_tokens: int) -> float:
        """The rate of step `step` (0-based): `lr` for the first 1 - DECAY of the S' = ceil(S) steps, then falling
        linearly to 0 at step S' (0 past it)."""
        total = math.ceil(self.steps(train_tokens))
        decay_from = total * (1 - self.decay)
        if not self.decay or step < decay_from:
            return self.lr(train_tokens)
        return self.lr(train_tokens) * max(0.0, (total - step) / (total - decay_from))

    def dead_window(self, train_tokens: int) -> int:
        """The training tokens after which a feature that has not fired is dead: `dead_after`, else the tokens in
        which a feature of the mean firing rate k / F fires DEAD_FIRINGS times, at least one batch, at most
        Gao et al.'s 10^7 (docs/spec/analyses.md, "Training")."""
        if self.dead_after:
            return self.dead_after
        return int(min(10_000_000, max(self.batch_tokens, math.ceil(self.dead_firings * self.num_features / self.k))))


TokenBatches = Iterator[torch.Tensor]  # minibatches of normalised training tokens, (B, D) float32


def auxk_loss(sae: TopKSAE, pre: torch.Tensor, centred: torch.Tensor, residual: torch.Tensor, dead: torch.Tensor,
              k_aux: int) -> torch.Tensor:
    """Gao et al.'s AuxK loss: the residual (B, D) reconstructed from the k_aux largest pre-activations (B, F, no
    gradient: the chosen entries get theirs through `centred` = x_n - b_pre, `chosen_pre_activations`) among the
    `dead` (F,) bool features, its squared error over the residual's own squared norm; 0 with no dead feature."""
    dead_features = dead.nonzero()[:, 0]  # (n_dead,), increasing
    if len(dead_features) == 0:
        return pre.new_zeros(())
    # only the dead compete: a few hundred of F columns, so the choice reads those columns alone
    _, among_dead = pre[:, dead_features].topk(min(k_aux, len(dead_features)), dim=-1)  # (B, k_aux)
    indices = dead_features[among_dead]  # (B, k_aux): feature indices
    values = chosen_pre_activations(sae, centred, pre, indices)  # (B, k_aux)
    estimate = sparse_decode(sae, F.relu(values), indices)  # (B, D): no bias, it reconstructs an error
    return (residual - estimate).pow(2).sum(-1).mean() / residual.pow(2).sum(-1).mean().clamp_min(1e-12)


def run_minibatches(batches_of_epoch, settings: TrainingSettings) -> Iterator[torch.Tensor]:
    """Every minibatch (B, D) of a run in its order: `settings.epochs` epochs of `batches_of_epoch(epoch, generator)`,
    all shuffled by one generator seeded with seed + 1 (the benchmark feeds other trainers the same minibatches)."""
    generator = torch.Generator().manual_seed(settings.seed + 1)
    for epoch in range(settings.epochs):
        yield from batches_of_epoch(epoch, generator)


def train_sae(batches_of_epoch, d_model: int, train_tokens: int, settings: TrainingSettings,
              progress=None) -> TopKSAE:
    """A TopK SAE trained on the minibatches `batches_of_epoch(epoch, generator)` yields (normalised tokens (B, D)),
    for `settings.epochs` epochs; bit-identical for the same tokens, settings and torch threads (every random draw
    comes from one generator seeded with `settings.seed`). progress(step) after each step."""
    sae = initialised_sae(d_model, settings.num_features, settings.k, settings.seed)
    rate = settings.lr(train_tokens)
    optimiser = torch.optim.Adam(sae.parameters(), lr=rate, betas=(0.9, 0.999), eps=6.25e-10)
    k_aux = settings.k_aux or max(1, d_model // 2)
    dead_after = settings.dead_window(train_tokens)
    since_fired = torch.zeros(settings.num_features, dtype=torch.long)  # (F,): tokens since each feature last fired
    step = 0
    for x_n in run_minibatches(batches_of_epoch, settings):
        centred = x_n - sae.b_pre  # (B, D)
        with torch.no_grad():  # the loss reads k + k_aux entries per token: their gradient is taken sparsely
            pre = centred @ sae.W_enc.T + sae.b_enc  # (B, F): sae.pre_activations, the same bits
        _, indices = pre.topk(sae.k, dim=-1)  # (B, k): where z's non-zero entries are
        values = F.relu(chosen_pre_activations(sae, centred, pre, indices))  # (B, k)
        reconstruction = sparse_decode(sae, values, indices) + sae.b_pre  # (B, D): sae.decode of the same z
        residual = x_n - reconstruction
        loss = residual.pow(2).sum(-1).mean() / d_model
        fired = torch.zeros(settings.num_features, dtype=torch.bool)
        fired[indices[values > 0]] = True  # (F,)
        since_fired = torch.where(fired, 0, since_fired + len(x_n))
        dead = since_fired >= dead_after
        loss = loss + AUXK_COEFFICIENT * auxk_loss(sae, pre, centred, residual.detach(), dead, k_aux)
        for group in optimiser.param_groups:
            group["lr"] = settings.rate_at(step, train_tokens)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        sae.project_decoder_gradient()
        optimiser.step()
        sae.normalise_decoder()
        step += 1
        if progress:
            progress(step)
    return sae.eval()


# ----------------------------------------------------------------------------------------------
# The file: the autoencoder with the model's name, the layer and the normalisation


@dataclass(frozen=True)
class Concepts:
    """A trained autoencoder for one model and layer, ready to encode that layer's tokens."""

    sae: TopKSAE
    normalisation: Normalisation
    model: str  # the model's name, as vit_core.load_model takes it
    weights: str  # where the model's weights came from (LoadedModel.weights)
    layer: int  # the residual stream after this block (0-based)

    def codes(self, tokens: np.ndarray | torch.Tensor) -> torch.Tensor:
        """Sparse codes (N, F) of tokens (N, D) in the model's units."""
        x = torch.from_numpy(np.array(tokens, dtype=np.float32)) if isinstance(tokens, np.ndarray) else tokens  # a copy: writable
        with torch.no_grad():
            return self.sae.encode(self.normalisation.apply(x.float()))

    def reconstruction(self, z: torch.Tensor) -> torch.Tensor:
        """x^ (N, D) in the model's units of codes z (N, F)."""
        with torch.no_grad():
            return self.normalisation.undo(self.sae.decode(z))

    def share(self, z: torch.Tensor, feature: int) -> torch.Tensor:
        """Feature f's share of the reconstruction in the model's units: s z_f d_f, (N, D)."""
        with torch.no_grad():
            return self.normalisation.scale * z[:, feature:feature + 1] * self.sae.W_dec[:, feature]

    def encode(self, tokens: np.ndarray) -> np.ndarray:
        """float32 (N, F) codes of float32 (N, D) tokens."""
        return self.codes(tokens).numpy()

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """float32 (N, D) reconstruction in the model's units of float32 (N, F) codes."""
        return self.reconstruction(torch.as_tensor(np.asarray(codes, dtype=np.float32))).numpy()


def concepts_tensors(concepts: Concepts) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    sae = concepts.sae
    tensors = {"W_enc": sae.W_enc, "b_enc": sae.b_enc, "W_dec": sae.W_dec, "b_pre": sae.b_pre,
               "norm_mean": torch.from_numpy(concepts.normalisation.mean),
               "norm_scale": torch.tensor(concepts.normalisation.scale, dtype=torch.float64)}
    metadata = {"format": FORMAT, "model": concepts.model, "weights": concepts.weights, "layer": str(concepts.layer),
                "k": str(sae.k), "normalisation": NORMALISATION}
    return {key: value.detach().contiguous().clone() for key, value in tensors.items()}, metadata


def concepts_bytes(concepts: Concepts) -> bytes:
    """concepts.safetensors: the autoencoder's tensors and, as metadata, the model, layer, k and normalisation; the
    same bytes for the same tensors in every process (`safetensors_bytes`)."""
    tensors, metadata = concepts_tensors(concepts)
    return safetensors_bytes(tensors, metadata)


SAFETENSORS_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
                      torch.bool: "BOOL", torch.uint8: "U8", torch.float16: "F16"}


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors format written with a fixed layout, so that equal tensors give equal bytes (the safetensors
    library writes `__metadata__` in a per-process random order, its issue 584): an 8-byte little-endian header
    length, the JSON header with its keys sorted (`__metadata__` among them), compact, padded with spaces to a
    multiple of 8 bytes, then the tensors' raw little-endian bytes one after the other, the widest dtype first and
    by name within a dtype (every tensor then starts aligned to its item size), as the library itself orders them."""
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    data, offset = [], 0
    for name in order:
        tensor = tensors[name].detach().cpu().contiguous()
        if tensor.dtype not in SAFETENSORS_DTYPES:
            raise ConceptsError(f"The tensor {name} has the dtype {tensor.dtype}, which this writer does not handle.")
        array = tensor.numpy()
        raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()  # little-endian on any host
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data.append(raw)
        offset += len(raw)
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text + b"".join(data)


def read_summary(folder: str | Path) -> dict:
    """concepts.json beside a concepts.safetensors (or in the folder); {} where there is none."""
    folder = Path(folder)
    path = folder / "concepts.json" if folder.is_dir() else folder.with_name("concepts.json")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConceptsError(f"{path} can't be read ({e}).") from None
