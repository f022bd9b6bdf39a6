"""Deploy a trained ``DecoderLM`` checkpoint at parameter budgets: what ``litlab export`` runs.

For each budget f (a fraction of the selected blocks' dense parameters, as in ``capacity``) the checkpoint's
structured surrogate (SALAAD's ``(L, S)`` in ``checkpoint["callbacks"]["SALAAD"]``) is deployed by Homomorphic
Parameter Allocation — or, for a checkpoint without one, the dense weights are compressed post hoc — and written to
``<out>/budget_<f>/``:

* ``config.json`` + ``model.safetensors``: a plain Hugging Face model (``AutoModelForCausalLM.from_pretrained``)
  whose block weights are the dense surrogates ``X̂ = U_k' diag(σ) V_k'ᵀ + S``;
* ``factored.safetensors``: the same model stored small — every block as ``A = U_k'√σ`` (m × k'), ``B = √σ V_k'ᵀ``
  (k' × n) and S in CSR (``crow`` / ``col`` int32, ``val`` fp32), every other tensor as is;
* ``deploy.json``: budget, ranks k' per block, counted parameters (blocks and total), the files' bytes, and the
  measured resident and peak inference bytes of the factored model against the dense one (``footprint``).

``<out>/dense/`` holds the checkpoint's own dense model (the reference of the byte ratios).
"""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from litlab.lit_modules.core.errors import CheckpointError
from litlab.lit_modules.core.io import atomic_write_json
from litlab.lit_modules.structured.capacity import Deployment, deploy
from litlab.lit_modules.structured.footprint import deployed_memory
from litlab.lit_modules.structured.lm import BLOCKS, DecoderLM, find_blocks

STATE_KEY = "SALAAD"


def load(ckpt: str | Path) -> tuple[DecoderLM, dict | None]:
    """The module of a ``DecoderLM`` checkpoint and its blocks: ``name -> (layer, L, S)`` when it carries a
    structured surrogate, else ``None``."""
    path = Path(ckpt)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # truncated or not a checkpoint
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(err).__name__}: {err})") from err
    params = inspect.signature(DecoderLM.__init__).parameters
    hparams = {k: v for k, v in state.get("hyper_parameters", {}).items() if k in params}
    module = DecoderLM(**hparams)
    module.load_state_dict(state["state_dict"])
    module.eval()
    salaad = next((v for k, v in state.get("callbacks", {}).items() if k.startswith(STATE_KEY)), None)
    if salaad is None:
        return module, None
    layers = dict(module.named_modules())
    blocks = {n: (layers[n], b["L"].float(), b["S"].float()) for n, b in salaad["blocks"].items()}
    return module, blocks


def _csr(S: Tensor) -> dict[str, Tensor]:
    sp = S.to_sparse_csr()
    return {
        "crow": sp.crow_indices().to(torch.int32),
        "col": sp.col_indices().to(torch.int32),
        "val": sp.values().contiguous(),
    }


def factored_tensors(module: DecoderLM, dep: Deployment) -> dict[str, Tensor]:
    """The deployed model as factored tensors: block ``n`` -> ``n.A`` (U diag(σ), m × k'), ``n.B`` (Vᵀ, k' × n) and
    ``n.S.{crow,col,val}`` (CSR); every other tensor of the Hugging Face model as is."""
    out, block_weights = {}, set()
    for name, (A, B, S) in dep.parts.items():
        key = name.removeprefix("model.")
        out[f"{key}.A"], out[f"{key}.B"] = A.contiguous(), B.contiguous()
        out.update({f"{key}.S.{k}": v for k, v in _csr(S).items()})
        block_weights.add(f"{key}.weight")
    for key, t in module.hf_model.state_dict().items():
        if key not in block_weights:
            out[key] = t.detach().contiguous()
    return out


def factored_weight(tensors: dict[str, Tensor], key: str, shape: tuple[int, int]) -> Tensor:
    """A block's dense weight back from ``factored.safetensors`` (``key`` without ``.weight``)."""
    S = torch.sparse_csr_tensor(
        tensors[f"{key}.S.crow"].long(), tensors[f"{key}.S.col"].long(), tensors[f"{key}.S.val"], size=shape
    ).to_dense()
    return tensors[f"{key}.A"] @ tensors[f"{key}.B"] + S


def export(
    ckpt: str | Path,
    budgets: list[float],
    out: str | Path,
    posthoc_density: float = 0.05,
    blocks_pattern: str = BLOCKS,
    measure_memory: bool = True,
) -> list[dict]:
    """Write ``<out>/dense/`` and ``<out>/budget_<f>/`` for every budget; returns each budget's ``deploy.json``."""
    module, blocks = load(ckpt)
    out = Path(out)
    hf = module.hf_model
    dense_dir = out / "dense"
    hf.save_pretrained(dense_dir)
    dense_bytes = (dense_dir / "model.safetensors").stat().st_size
    source = blocks if blocks is not None else find_blocks(module, blocks_pattern)
    layers = {n: (v[0] if isinstance(v, tuple) else v) for n, v in source.items()}
    n_total = sum(p.numel() for p in hf.parameters())
    n_rest = n_total - sum(lin.weight.numel() for lin in layers.values())
    records = []
    for f in budgets:
        if not 0.0 <= f <= 1.0 or math.isnan(f):
            raise ValueError(f"budget {f} must lie in [0, 1] (a fraction of the blocks' dense parameters)")
        dep = deploy(source, f, posthoc_density)
        folder = out / f"budget_{f:g}"
        saved = {n: lin.weight.detach().clone() for n, lin in layers.items()}
        with torch.no_grad():
            for n, w in dep.weights.items():
                layers[n].weight.copy_(w)
        hf.save_pretrained(folder)
        factored = factored_tensors(module, dep)
        save_file(factored, str(folder / "factored.safetensors"))
        with torch.no_grad():
            for n, w in saved.items():
                layers[n].weight.copy_(w)
        record = {
            "budget": f,
            "source": dep.source,
            "ranks": {n.removeprefix("model."): k for n, k in dep.ranks.items()},
            "block_params": dep.block_params,
            "dense_block_params": dep.dense_block_params,
            "block_fraction": dep.fraction,
            "total_params": n_rest + dep.block_params,
            "dense_total_params": n_total,
            "hf_bytes": (folder / "model.safetensors").stat().st_size,
            "factored_bytes": (folder / "factored.safetensors").stat().st_size,
            "dense_bytes": dense_bytes,
        }
        record["factored_bytes_ratio"] = record["factored_bytes"] / dense_bytes
        if measure_memory:
            record.update(deployed_memory(folder, dense_dir))
        atomic_write_json(folder / "deploy.json", record)
        records.append(record)
    (out / "export.json").write_text(json.dumps(records, indent=1))
    return records
