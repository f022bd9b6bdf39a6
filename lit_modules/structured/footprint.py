"""The deployed model run small, and its memory measured: what the size ratios of ``litlab export`` rest on.

``load_factored(folder)`` builds the Hugging Face model of ``<folder>/config.json`` and replaces every block that
``factored.safetensors`` stores as ``A, B, S`` by a ``FactoredLinear``, ``y = (x Bᵀ) Aᵀ + x Sᵀ`` with S kept in CSR,
so a block costs its k'(m + n) factor entries plus S's non-zeros and indices, never the dense m × n matrix.

``inference_memory(load, input_ids)`` measures, with PyTorch's profiler (``profile_memory=True``: every CPU
allocation and free of PyTorch's allocator, in time order), the bytes of live tensors

* ``resident_bytes``: after ``load()`` returned (the weights the process holds; transients of loading freed), and
* ``peak_bytes``: the largest live total during one ``no_grad`` forward of ``input_ids`` (weights + activations).

Only PyTorch's allocations are counted, not the interpreter, the libraries or the safetensors file mapping, so the
numbers of a dense and a factored model of the same config compare like with like.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file
from torch import Tensor, nn

FACTORED_FILE = "factored.safetensors"


class FactoredLinear(nn.Module):
    """``nn.Linear`` replacement holding ``W = A B + S`` as factors: A (m × k'), B (k' × n), S in CSR (m × n)."""

    def __init__(
        self, A: Tensor, B: Tensor, crow: Tensor, col: Tensor, val: Tensor, bias: Tensor | None = None
    ):
        super().__init__()
        if A.shape[1] != B.shape[0]:
            raise ValueError(f"factors A {tuple(A.shape)} and B {tuple(B.shape)} disagree on the rank")
        self.in_features, self.out_features = B.shape[1], A.shape[0]
        self.register_buffer("A", A)
        self.register_buffer("B", B)
        self.register_buffer("crow", crow)
        self.register_buffer("col", col)
        self.register_buffer("val", val)
        self.register_buffer("bias", bias)

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, self.in_features)
        y = (flat @ self.B.T) @ self.A.T
        if self.val.numel():
            S = torch.sparse_csr_tensor(
                self.crow, self.col, self.val, size=(self.out_features, self.in_features)
            )
            y = y + (S @ flat.T).T
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def load_factored(folder: str | Path) -> transformers.PreTrainedModel:
    """The model of ``<folder>/config.json`` with every factored block of ``<folder>/factored.safetensors`` as a
    ``FactoredLinear`` and every other tensor loaded from it."""
    folder = Path(folder)
    path = folder / FACTORED_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: `litlab export` writes it next to config.json")
    tensors = load_file(str(path))
    config = transformers.AutoConfig.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_config(config)
    modules = dict(model.named_modules())
    block_keys = sorted({k.removesuffix(".A") for k in tensors if k.endswith(".A")})
    for key in block_keys:
        name = key if key in modules else f"model.{key}"
        if name not in modules:
            raise KeyError(
                f"{path}: block {key!r} is not a module of the {config.model_type} model in {folder}"
            )
        linear = modules[name]
        parent_name, _, child = name.rpartition(".")
        # clones: a tensor read by safetensors may be a view into a buffer it shares with the file's other tensors
        factored = FactoredLinear(
            tensors.pop(f"{key}.A").clone(),
            tensors.pop(f"{key}.B").clone(),
            tensors.pop(f"{key}.S.crow").clone(),
            tensors.pop(f"{key}.S.col").clone(),
            tensors.pop(f"{key}.S.val").clone(),
            linear.bias.detach() if linear.bias is not None else None,
        )
        setattr(modules[parent_name] if parent_name else model, child, factored)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    factored_names = {f"{k}.{p}" for k in block_keys for p in ("A", "B", "crow", "col", "val")}
    missing = [m for m in missing if m not in factored_names and not m.endswith(".bias")]
    if missing or unexpected:
        raise KeyError(f"{path}: tensors missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()


def _live_bytes(events: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(time, live bytes after the event) from allocator events (time, +bytes allocated / -bytes freed)."""
    live, out = 0, []
    for t, nbytes in sorted(events):
        live += nbytes
        out.append((t, live))
    return out


def inference_memory(load: Callable[[], nn.Module], input_ids: Tensor) -> dict[str, int]:
    """``resident_bytes`` after ``load()`` and ``peak_bytes`` during one forward of ``input_ids`` (see module doc)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model = load()
        with torch.no_grad(), record_function("litlab_forward"):
            model(input_ids=input_ids)
    events = prof.profiler.kineto_results.events()
    memory = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"]
    marker = next((e for e in events if e.name() == "litlab_forward"), None)
    if marker is None or not memory:
        raise RuntimeError("the profiler recorded no allocator events: profile_memory is not supported here")
    timeline = _live_bytes(memory)
    before = [live for t, live in timeline if t < marker.start_ns()]
    during = [live for t, live in timeline if marker.start_ns() <= t <= marker.end_ns()]
    resident = before[-1] if before else 0
    return {"resident_bytes": resident, "peak_bytes": max([resident, *during])}


def deployed_memory(
    folder: str | Path, dense_folder: str | Path, tokens: int | None = None
) -> dict[str, float]:
    """Resident and peak inference bytes of ``folder``'s factored model and of ``dense_folder``'s dense model, on
    the same 1 × ``tokens`` prompt (default: the model's context length), with their ratios."""
    config = json.loads((Path(dense_folder) / "config.json").read_text())
    n = tokens or int(config.get("max_position_embeddings", 128))
    ids = torch.randint(0, int(config["vocab_size"]), (1, n), generator=torch.Generator().manual_seed(0))
    dense = inference_memory(
        lambda: transformers.AutoModelForCausalLM.from_pretrained(dense_folder).eval(), ids
    )
    factored = inference_memory(lambda: load_factored(folder), ids)
    return {
        "memory_tokens": n,
        "dense_resident_bytes": dense["resident_bytes"],
        "dense_peak_bytes": dense["peak_bytes"],
        "factored_resident_bytes": factored["resident_bytes"],
        "factored_peak_bytes": factored["peak_bytes"],
        "resident_ratio": factored["resident_bytes"] / dense["resident_bytes"],
        "peak_ratio": factored["peak_bytes"] / dense["peak_bytes"],
    }
