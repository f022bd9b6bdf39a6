"""Timings, run with ``litlab bench <name> [args]``: each module here has ``main(argv) -> int``.

``kernels`` (the Triton kernels against SDPA / cuBLAS / their PyTorch references, GPU), ``rl_loop`` (a Lightning RL
loop against the same loop in plain PyTorch), ``continual_steps`` (each continual method's step time relative to
plain LoRA), ``sale_prefill`` (SALE's prefill attention against dense SDPA on the CPU). Numbers from these never
decide a card's claim.
"""
