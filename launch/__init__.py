"""Launchers: the trainer and its index builder side by side, locally (`local`) or on two TPU VM
slices (`tpu_pod`); installed as `realm_jax_launch`. Standard library only; see
launch/README.md."""
