"""Test-wide setup: 8 fake CPU devices, so sharding code runs on a real (if simulated) mesh.

Set before anything imports jax (conftest loads first). Single-device code is unaffected: it
runs on device 0.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()
