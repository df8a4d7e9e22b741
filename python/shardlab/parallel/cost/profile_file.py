"""The calibrated profile's file: ``save_profile`` writes a ``DeviceProfile`` as JSON,
``load_profile`` reads one back (read with ``json`` and checked field by field, never
evaluated; ``ProfileFileError`` names the file and the field). ``calibrate.py`` measures the
profiles and re-exports these names.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import stat
from collections.abc import Mapping
from typing import Any

from shardlab.parallel.cost.compilers import COMPILERS
from shardlab.parallel.cost.network import Link
from shardlab.parallel.cost.profiles import (
    DEVICE_PROFILES,
    Calibration,
    CollectiveFit,
    DeviceProfile,
    register_profile,
)
from shardlab.parallel.records import COLLECTIVE_KINDS

__all__ = [
    "FORMAT",
    "VERSION",
    "ProfileFileError",
    "load_profile",
    "profile_from_dict",
    "save_profile",
]

FORMAT = "shardlab-device-profile"
VERSION = 1


class ProfileFileError(ValueError):
    """A profile file that cannot be read: names the file and the field."""


MAX_FILE_BYTES = 16 * 1024 * 1024
"""A profile file is a few kilobytes; anything above this is not one (and is not read)."""

MAX_COUNT = 2**24
"""The largest device count, group size, run count or mesh axis a profile may name."""


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: messages name a value, never repeat a
    whole field."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer too long to print, a deep structure
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _read_text(path: str | os.PathLike[str], where: str) -> str:
    """The file's text, read only from a regular file of at most ``MAX_FILE_BYTES`` (a FIFO
    would block, ``/dev/zero`` never ends)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ProfileFileError(f"{where}: not a regular file (a profile is a JSON file)")
        if info.st_size > MAX_FILE_BYTES:
            raise ProfileFileError(
                f"{where}: {info.st_size} bytes, larger than a profile file can be "
                f"({MAX_FILE_BYTES} bytes)"
            )
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except ProfileFileError:
        raise
    except (OSError, ValueError) as error:  # missing, unreadable, a NUL in the path
        raise ProfileFileError(
            f"{where}: cannot read the profile file ({_short(error, 120)})"
        ) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ProfileFileError(f"{where}: larger than a profile file can be")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProfileFileError(f"{where}: not a JSON profile file ({error.reason})") from None


def save_profile(profile: DeviceProfile, path: str | os.PathLike[str]) -> str:
    """Write ``profile`` as JSON; returns the path."""
    data = {"format": FORMAT, "version": VERSION, "profile": profile.to_dict()}
    with open(path, "w") as handle:
        json.dump(data, handle, indent=1)
    return os.fspath(path)


def load_profile(path: str | os.PathLike[str]) -> DeviceProfile:
    """Read a profile written by ``save_profile``, checking every field.

    Raises:
        ProfileFileError: the file is not JSON, not a profile, or a field is missing or
            has the wrong type or an impossible value (the message names it).
    """
    try:
        where = _short(os.fspath(path), 200)
    except TypeError:
        raise ProfileFileError(f"{_short(path)} is not a path to a profile file") from None
    text = _read_text(path, where)
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as error:  # JSONDecodeError, 4,300+ digit integers
        raise ProfileFileError(f"{where}: not a JSON profile file ({_short(error, 120)})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ProfileFileError(
            f"{where}: not a shardlab profile (expected 'format': {FORMAT!r}; write one with "
            "save_profile(shardlab.calibrate(), path))"
        )
    if data.get("version") != VERSION:
        raise ProfileFileError(
            f"{where}: field 'version' is {_short(data.get('version'))}; this shardlab reads "
            f"{VERSION}"
        )
    profile = profile_from_dict(data.get("profile"), where=where)
    if profile.calibration is None:
        return profile
    if profile.name in DEVICE_PROFILES:
        raise ProfileFileError(
            f"{where}: field 'name' is {_short(profile.name)}, a datasheet profile's name; a "
            "calibrated profile needs its own (e.g. 'calibrated-cpu8-20261202T131500')"
        )
    return register_profile(profile)


def _field(data: Mapping[str, Any], name: str, kind: Any, where: str, *, positive=False) -> Any:
    if name not in data:
        raise ProfileFileError(f"{where}: field {_short(name)} is missing")
    value = data[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if ok and float in kinds and isinstance(value, (int, float)):
        try:
            ok = math.isfinite(value) and value >= 0 and (value > 0 or not positive)
        except OverflowError:  # an integer past float's range
            ok = False
    if ok and int in kinds and float not in kinds and isinstance(value, int):
        ok = -MAX_COUNT <= value <= MAX_COUNT and (value > 0 or not positive)
        if not ok:
            expected = f"a whole number from {1 if positive else -MAX_COUNT} to {MAX_COUNT}"
            raise ProfileFileError(
                f"{where}: field {name!r} is {_short(value)}, expected {expected}"
            )
    if not ok:
        expected = (
            "a positive finite number" if positive else " or ".join(k.__name__ for k in kinds)
        )
        raise ProfileFileError(
            f"{where}: field {_short(name)} is {_short(value)}, expected {expected}"
        )
    return value


def _measured(
    data: Mapping[str, Any], name: str, default: float, where: str, bounds: tuple[float, float]
) -> float:
    """A measured figure within ``bounds``; ``default`` in files written before it was
    measured."""
    value = data.get(name, default)
    low, high = bounds
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        within = f"from {low:g} to {high:g}" if math.isfinite(high) else f"of at least {low:g}"
        raise ProfileFileError(
            f"{where}: field {name!r} is {_short(value)}, expected a number {within}"
        )
    return float(value)


def _number_map(data: Mapping[str, Any], name: str, where: str) -> dict[str, float]:
    value = _field(data, name, dict, where)
    out = {}
    for key, number in value.items():
        _field(value, key, (int, float), f"{where}: {name}", positive=True)
        out[str(key)] = float(number)
    return out


def profile_from_dict(data: Any, *, where: str = "profile") -> DeviceProfile:
    """A ``DeviceProfile`` from its ``to_dict()`` form, every field checked.

    Raises:
        ProfileFileError: a field is missing, of the wrong type or out of range.
    """
    if not isinstance(data, dict):
        raise ProfileFileError(f"{where}: field 'profile' is {type(data).__name__}, not an object")
    num = (int, float)
    fits = []
    raw_fits = _field(data, "collective_fits", list, where)
    for i, fit in enumerate(raw_fits):
        at = f"{where}: collective_fits[{i}]"
        if not isinstance(fit, dict):
            raise ProfileFileError(f"{at} is {_short(fit)}, expected an object")
        kind = _field(fit, "kind", str, at)
        if kind not in COLLECTIVE_KINDS:
            raise ProfileFileError(
                f"{at}: field 'kind' is {_short(kind)}; known: {', '.join(COLLECTIVE_KINDS)}"
            )
        group = _field(fit, "group_size", int, at)
        if group < 2:
            raise ProfileFileError(f"{at}: field 'group_size' is {group!r}, expected 2 or more")
        sizes = _field(fit, "result_bytes", list, at)
        seconds = _field(fit, "seconds", list, at)
        if len(sizes) != len(seconds):
            raise ProfileFileError(
                f"{at}: {len(sizes)} result_bytes but {len(seconds)} seconds; they pair up"
            )
        for j, s in enumerate(sizes):
            _field({"result_bytes": s}, "result_bytes", int, f"{at}[{j}]", positive=True)
        for j, s in enumerate(seconds):
            _field({"seconds": s}, "seconds", num, f"{at}[{j}]", positive=True)
        fits.append(
            CollectiveFit(
                kind=kind,
                axis=_field(fit, "axis", str, at),
                group_size=group,
                alpha=float(_field(fit, "alpha", num, at)),
                beta=float(_field(fit, "beta", num, at, positive=True)),
                residual=float(_field(fit, "residual", num, at)),
                result_bytes=tuple(int(s) for s in sizes),
                seconds=tuple(float(s) for s in seconds),
            )
        )
    raw = data.get("calibration")
    calibration = None
    if raw is not None:
        at = f"{where}: calibration"
        if not isinstance(raw, dict):
            raise ProfileFileError(f"{at} is {_short(raw)}, expected an object or null")
        date = _field(raw, "date", str, at)
        try:
            datetime.datetime.fromisoformat(date.replace("Z", "+00:00"))
        except ValueError:
            raise ProfileFileError(
                f"{at}: field 'date' is {_short(date)}, expected ISO 8601 (2026-12-02T13:00:00Z)"
            ) from None
        mesh = _field(raw, "mesh", dict, at)
        for axis, size in mesh.items():
            if not isinstance(size, int) or isinstance(size, bool) or not 1 <= size <= MAX_COUNT:
                raise ProfileFileError(
                    f"{at}: mesh axis {_short(axis)} has size {_short(size)}, expected a "
                    f"whole number from 1 to {MAX_COUNT}"
                )
        count = _field(raw, "device_count", int, at, positive=True)
        calibration = Calibration(
            date=date,
            platform=_field(raw, "platform", str, at),
            device_kind=_field(raw, "device_kind", str, at),
            device_count=count,
            mesh={str(k): int(v) for k, v in mesh.items()},
            quick=_field(raw, "quick", bool, at),
            seconds=float(_field(raw, "seconds", num, at)),
            runs=_field(raw, "runs", int, at, positive=True),
            matmul_residual=float(_field(raw, "matmul_residual", num, at)),
            bandwidth_residual=float(_field(raw, "bandwidth_residual", num, at)),
            dispatch=float(_field(raw, "dispatch", num, at)),
            jax_version=str(raw.get("jax_version", ""))[:80],
        )
    name = _field(data, "name", str, where)
    if not name or len(name) > 200:
        raise ProfileFileError(
            f"{where}: field 'name' is {_short(name)}, expected 1 to 200 characters"
        )
    platform = _platform(data, calibration, where)
    return DeviceProfile(
        name=name,
        peak_flops=float(_field(data, "peak_flops", num, where, positive=True)),
        memory_bytes=int(_field(data, "memory_bytes", num, where, positive=True)),
        memory_bandwidth=float(_field(data, "memory_bandwidth", num, where, positive=True)),
        link_bandwidth=float(_field(data, "link_bandwidth", num, where, positive=True)),
        link_latency=float(_field(data, "link_latency", num, where)),
        axis_bandwidth=_number_map(data, "axis_bandwidth", where),
        kind_bandwidth=_number_map(data, "kind_bandwidth", where),
        platform=platform,
        source=_field(data, "source", str, where)[:4000],
        op_overhead=float(_field(data, "op_overhead", num, where)),
        overlap=_measured(data, "overlap", 1.0, where, (0.0, 1.0)),
        operand_latency=_measured(data, "operand_latency", 0.0, where, (0.0, 1.0)),
        narrow_convolution=_measured(data, "narrow_convolution", 1.0, where, (1.0, math.inf)),
        feature_overhead=_measured(data, "feature_overhead", 0.0, where, (0.0, math.inf)),
        matmul_efficiency=_measured(data, "matmul_efficiency", 1.0, where, (1e-3, 1.0)),
        memory_efficiency=_measured(data, "memory_efficiency", 1.0, where, (1e-3, 1.0)),
        matmul_latency=_measured(data, "matmul_latency", 0.0, where, (0.0, 1.0)),
        matmul_tile=int(_measured(data, "matmul_tile", 0, where, (0, 4096))),
        collective_fits=tuple(fits),
        calibration=calibration,
        links=_links(data, where),
        axis_split=_axis_split(data, where),
    )


def _platform(data: dict[str, Any], calibration: Calibration | None, where: str) -> str:
    """The profile's platform, which chooses its compiler's rules (``compilers.py``). Files
    written before profiles named it carry the CPU compiler's rule as
    ``forms_reduce_scatter: false`` instead; their calibration names the platform too."""
    if "platform" in data:
        platform = _field(data, "platform", str, where)
    elif calibration is not None:
        platform = calibration.platform
    else:
        platform = "gpu" if _field(data, "forms_reduce_scatter", bool, where) else "cpu"
    if platform not in COMPILERS:
        raise ProfileFileError(
            f"{where}: field 'platform' is {platform[:40]!r}, expected one of "
            f"{', '.join(COMPILERS)}"
        )
    return platform


def _links(data: Mapping[str, Any], where: str) -> tuple[Link, ...]:
    """The network levels (``network.Link``); none in files written before profiles had
    them."""
    raw = data.get("links", [])
    if not isinstance(raw, list) or len(raw) > 4:
        raise ProfileFileError(f"{where}: field 'links' is not a list of at most 4 levels")
    num = (int, float)
    out = []
    for k, link in enumerate(raw):
        at = f"{where}: links[{k}]"
        if not isinstance(link, dict):
            raise ProfileFileError(f"{at} is not an object")
        curve = link.get("curve", [])
        if not isinstance(curve, list) or len(curve) > 64:
            raise ProfileFileError(f"{at}: field 'curve' is not a list of at most 64 points")
        points = []
        for j, point in enumerate(curve):
            if not (isinstance(point, list) and len(point) == 2):
                raise ProfileFileError(f"{at}: curve[{j}] is not a [bytes, seconds] pair")
            pair = {"bytes": point[0], "seconds": point[1]}
            size = _field(pair, "bytes", num, f"{at}: curve[{j}]", positive=True)
            seconds = _field(pair, "seconds", num, f"{at}: curve[{j}]", positive=True)
            points.append((float(size), float(seconds)))
        if [p for p, _ in points] != sorted({p for p, _ in points}):
            raise ProfileFileError(f"{at}: curve sizes must ascend, each once")
        out.append(
            Link(
                name=_field(link, "name", str, at)[:80],
                bandwidth=float(_field(link, "bandwidth", num, at, positive=True)),
                latency=float(_field(link, "latency", num, at)),
                step_latency=float(_field(link, "step_latency", num, at)),
                curve=tuple(points),
                curve_devices=max(2, int(_field(link, "curve_devices", int, at))),
                all_reduce_bandwidth=float(_field(link, "all_reduce_bandwidth", num, at)),
                source=_field(link, "source", str, at)[:2000],
            )
        )
    return tuple(out)


def _axis_split(data: Mapping[str, Any], where: str) -> dict[str, tuple[int, int]]:
    raw = data.get("axis_split", {})
    if not isinstance(raw, dict):
        raise ProfileFileError(f"{where}: field 'axis_split' is not an object")
    out = {}
    for axis, pair in raw.items():
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
        if not ok or not (1 <= pair[0] <= 2**20 and 1 <= pair[1] <= 2**20):
            raise ProfileFileError(
                f"{where}: axis_split[{str(axis)[:40]!r}] is not [devices inside, hosts]"
            )
        out[str(axis)] = (pair[0], pair[1])
    return out
