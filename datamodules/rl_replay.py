"""A tensor replay buffer (ring) whose ``state_dict`` is plain tensors and ints, so it travels inside a
Lightning checkpoint loaded with ``weights_only=True``."""

from __future__ import annotations

import torch

FIELDS = ("obs", "act", "rew", "next_obs", "terminal")


class ReplayBuffer:
    def __init__(self, obs_dim: int, act_dim: int, capacity: int):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        self.capacity, self.ptr, self.size = int(capacity), 0, 0
        shapes = {"obs": (obs_dim,), "act": (act_dim,), "rew": (), "next_obs": (obs_dim,), "terminal": ()}
        self.data = {k: torch.zeros((self.capacity, *s), dtype=torch.float32) for k, s in shapes.items()}

    def __len__(self) -> int:
        return self.size

    def add(self, **row: torch.Tensor | float) -> None:
        for k in FIELDS:
            self.data[k][self.ptr] = torch.as_tensor(row[k], dtype=torch.float32)
        self.ptr = (self.ptr + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def add_batch(self, rows: dict[str, torch.Tensor]) -> None:
        n = len(rows["obs"])
        if n > self.capacity:
            raise ValueError(f"{n} rows do not fit a buffer of capacity {self.capacity}")
        idx = (torch.arange(n) + self.ptr) % self.capacity
        for k in FIELDS:
            self.data[k][idx] = torch.as_tensor(rows[k], dtype=torch.float32).reshape(self.data[k][idx].shape)
        self.ptr = (self.ptr + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def last(self) -> dict[str, torch.Tensor]:
        """The row added most recently (views into the buffer, on its device)."""
        if self.size == 0:
            raise RuntimeError("the replay buffer is empty: no last row")
        i = (self.ptr - 1) % self.capacity
        return {k: v[i] for k, v in self.data.items()}

    def sample(self, n: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        idx = torch.randint(0, self.size, (n,))
        return {k: v[idx].to(device, non_blocking=True) for k, v in self.data.items()}

    def state_dict(self) -> dict[str, object]:
        """The filled rows in insertion order (oldest first) — tensors and ints only."""
        order = (torch.arange(self.size) + (self.ptr - self.size)) % self.capacity
        return {
            "capacity": self.capacity,
            "size": self.size,
            **{k: v[order].clone() for k, v in self.data.items()},
        }

    def load_state_dict(self, state: dict[str, object]) -> None:
        if int(state["capacity"]) != self.capacity:
            raise ValueError(
                f"checkpointed buffer capacity {state['capacity']} != configured {self.capacity}"
            )
        self.ptr = self.size = 0
        if int(state["size"]):
            self.add_batch({k: state[k] for k in FIELDS})
