"""Offline RL: the tool-conditioned networks, the algorithms, the training config, checkpoints, the trainer."""
