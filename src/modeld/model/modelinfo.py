"""The typed description of a GGUF model that every policy module works from.

Produced by :mod:`modeld.model.gguf` from the file header; consumed by :mod:`modeld.model.memory`,
:mod:`modeld.model.ctx`, the daemon and ``modeld show``. Pure data, no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: llama.cpp's LLAMA_POOLING_TYPE_RANK: the pooled output is a relevance score per sequence
POOLING_RANK = 4
#: what a request of each mode does, in words (for errors that say why a mode does not fit)
MODE_VERBS = {"generate": "generate text", "embed": "embed", "rerank": "rerank"}


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the GGUF tensor table."""

    name: str
    ggml_type: int
    type_name: str
    shape: tuple[int, ...]
    n_bytes: int
    offset: int


@dataclass(frozen=True)
class ModelInfo:
    """What modeld needs to know about a model before loading it.

    Per-layer fields (``head_count_kv``, ``sliding_layers``) always have ``block_count`` entries:
    a scalar in the file is expanded, so consumers never branch on the shape.
    """

    path: str
    file_size: int
    gguf_version: int
    architecture: str
    name: str | None
    size_label: str | None
    file_type: int | None
    quantization: str | None  # e.g. "Q4_K_M", derived from general.file_type
    context_length: int  # training context
    block_count: int
    embedding_length: int
    head_count: int
    head_count_kv: tuple[int, ...]  # per layer
    key_length: int
    value_length: int
    sliding_window: int | None
    sliding_layers: tuple[bool, ...]  # per layer: True where the layer uses the sliding window
    vocab_size: int
    has_chat_template: bool
    pooling_type: int | None  # embedding/rerank models set it; None when absent
    tensor_bytes: int  # sum of tensor data sizes
    tensor_count: int
    data_offset: int  # where tensor data starts in the file
    recurrent: bool = False  # SSM/RWKV/hybrid: KV estimate is approximate
    feed_forward_length: int = 0
    expert_count: int = 0
    tokenizer_model: str | None = None
    # the longest token's text in bytes, where no token decodes to more (SPM, byte-level BPE):
    # a text of n bytes is at least n / this many tokens (None: no such bound)
    token_bytes_max: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    tensors: tuple[TensorInfo, ...] = field(default=(), repr=False)
    scalars: dict[str, str | int | float | bool] = field(default_factory=dict, repr=False)
    notes: tuple[str, ...] = ()  # caveats found while reading (e.g. "approximate: recurrent")

    @property
    def is_embedding_model(self) -> bool:
        """True for models made for embeddings (pooling set, or BERT-like encoders)."""
        return self.pooling_type not in (None, 0) or self.architecture in {
            "bert",
            "nomic-bert",
            "jina-bert-v2",
            "t5encoder",
        }

    @property
    def is_reranker(self) -> bool:
        """True for cross-encoders made to score query-document pairs: rank pooling (4), which
        convert_hf_to_gguf writes for models with a classification head."""
        return self.pooling_type == POOLING_RANK

    @property
    def natural_mode(self) -> str:
        """The mode a load or show that names none gets: rerank for a reranker, else generate
        (an embedding model can generate too; embedding is asked for explicitly)."""
        return "rerank" if self.is_reranker else "generate"

    @property
    def kind(self) -> str:
        """What the model is made for, in words (for errors that say why a mode does not fit)."""
        if self.is_reranker:
            return f"a reranker (architecture {self.architecture})"
        if self.is_embedding_model:
            return f"an embedding model (architecture {self.architecture})"
        return f"a text-generation model (architecture {self.architecture})"

    def mode_mismatch(self, mode: str) -> str | None:
        """Why ``mode`` does not suit this model, or None: rerank needs a reranker, and a
        reranker does nothing else (its pooled output is one score, not text or a vector).
        The caller says what was asked (``cannot <MODE_VERBS[mode]>: <why>``)."""
        if mode == "rerank" and not self.is_reranker:
            return f"it is {self.kind}, not a reranker (no rank pooling in its GGUF)"
        if mode != "rerank" and self.is_reranker:
            return f"it is {self.kind}: it only scores query-document pairs"
        return None

    def summary(self) -> dict[str, object]:
        """A JSON-safe dict without the tensor table and raw scalars."""
        data = asdict(self)
        data.pop("tensors", None)
        data.pop("scalars", None)
        data["head_count_kv"] = list(self.head_count_kv)
        data["sliding_layers"] = list(self.sliding_layers)
        data["notes"] = list(self.notes)
        return data
