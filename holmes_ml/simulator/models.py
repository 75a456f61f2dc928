"""Model shapes and accelerator figures the simulator derives compute time and message sizes from.

Shapes are the published architectures (Llama 2 paper, GPT-3 paper, Mixtral model card). Parameter
counts are computed from the shapes, not copied, so that message sizes and FLOPs stay consistent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    Parameters
    ----------
    name:
        Registry key, e.g. ``"llama2-70b"``.
    layers, hidden, heads, kv_heads, ffn, vocab, seq_len:
        Architecture; ``kv_heads < heads`` means grouped-query attention.
    gated_mlp:
        SwiGLU MLP (three ``hidden x ffn`` matrices) instead of GELU (two).
    experts, topk:
        Mixture of experts: experts per layer and experts each token is routed to (1, 1 = dense).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    gated_mlp: bool = True
    experts: int = 1
    topk: int = 1

    @property
    def kv_dim(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def attn_params_per_layer(self) -> int:
        return self.hidden * (self.hidden + 2 * self.kv_dim) + self.hidden * self.hidden

    @property
    def expert_params_per_layer(self) -> int:
        """Parameters of one expert MLP (the only MLP of a dense model)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    @property
    def embedding_params(self) -> int:
        # Input embedding and untied output head.
        return 2 * self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All parameters (what gradients are synchronized for)."""
        per_layer = self.attn_params_per_layer + self.experts * self.expert_params_per_layer
        return self.layers * per_layer + self.embedding_params

    @property
    def dense_params(self) -> int:
        """Parameters outside the experts (replicated across expert-parallel ranks)."""
        return self.layers * self.attn_params_per_layer + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters each token flows through (what FLOPs scale with)."""
        per_layer = self.attn_params_per_layer + self.topk * self.expert_params_per_layer
        return self.layers * per_layer + self.embedding_params

    @property
    def is_moe(self) -> bool:
        return self.experts > 1


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
        ModelSpec("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
        ModelSpec("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
        ModelSpec("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, gated_mlp=False),
        ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, experts=8, topk=2),
    )
}

#: Default (tp, pp) per model when the user leaves them out; shrunk to fit small jobs.
DEFAULT_TP_PP: dict[str, tuple[int, int]] = {
    "llama2-7b": (2, 2),
    "llama2-13b": (4, 2),
    "llama2-70b": (8, 4),
    "gpt3-175b": (8, 8),
    "mixtral-8x7b": (2, 2),
}


@dataclass(frozen=True)
class Hardware:
    """Accelerator and fabric figures (bytes/s, FLOP/s, microseconds).

    ``nvlink_bw`` and ``nic_bw`` are the bus bandwidths NCCL reaches (``nccl-tests`` busbw), so the
    ring formulas below give realistic times; a leaf-spine link is provisioned at NIC speed
    (non-blocking rail-optimized fabric), so healthy flows are NIC-bound.
    """

    name: str
    peak_flops: float
    mfu: float
    nvlink_bw: float
    nic_bw: float
    alpha_intra_us: float = 3.0
    alpha_inter_us: float = 8.0
    hbm_bw: float = 1.5e12

    @property
    def flops(self) -> float:
        return self.peak_flops * self.mfu


HARDWARE: dict[str, Hardware] = {
    "a100": Hardware("a100", 312e12, 0.45, 230e9, 24e9, hbm_bw=1.9e12),
    "h100": Hardware("h100", 989e12, 0.40, 360e9, 48e9, hbm_bw=3.0e12),
}
