"""Shared RL core for litlab's RL methods (DARE, NGT): networks, SAC/IQL losses, replay buffer, environments,
D4RL-layout HDF5 I/O, score normalisation and the local data-set factory. One copy, imported by every method."""
