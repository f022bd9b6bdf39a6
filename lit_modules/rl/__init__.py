"""The RL family (DARE, NGT): networks, SAC/IQL losses, behaviour models and the random-prior potential, score
normalisation, the SAC route of the data factory, the report hooks, and ``contract.py`` — the one module that
reaches the data side (replay buffer, envs, D4RL-layout files live in ``litlab.datamodules``)."""
