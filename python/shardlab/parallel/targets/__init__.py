"""Targets: the GPU hosts and TPU slices a plan is made for, compiled without the hardware.

``catalog.py`` (the kinds, validated without JAX), ``devices.py`` (abstract devices from the
target's own compiler), ``layout.py`` (a mesh over hosts and slices), ``target.py``
(``shardlab.target`` and the ``Target`` record).
"""
