"""Devices and memory: device sets, pinning, the in-process CPU switch, live bytes, release."""
