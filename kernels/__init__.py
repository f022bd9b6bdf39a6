"""Shared Triton kernels with their PyTorch references.

a ``block_sparse_attention`` · b ``block_select`` · c1 ``lowrank`` · c2 ``lora_linear`` · dispatch rules in
``dispatch`` · GPU benchmark ``litlab bench kernels``.
"""
