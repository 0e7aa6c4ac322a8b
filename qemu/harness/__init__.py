"""The QEMU harness behind qemu/run, one module per concern and per scenario family."""
