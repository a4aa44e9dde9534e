"""REALM's recipe as stages (`stages`: jobs, their inputs and outputs, a plan), defined once for
every world and scale (`recipes`), with the checks of your data (`data_checks`), the BERT it
starts from (`bert`) and its result tables (`tables`). The runners that run a plan are the
launcher's: `realm_jax_launch.local` (this machine) and `realm_jax_launch.tpu_pod` (a pod)."""
