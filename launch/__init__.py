"""Launchers: the trainer and its index builder side by side, locally (`launch.local`) or on two
TPU VM slices (`launch.tpu_pod`). Standard library only; see launch/README.md."""
