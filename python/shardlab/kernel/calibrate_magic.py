"""``%calibrate``: measure the kernel's devices once, keep the profile, use it by default.

``%calibrate`` runs a quick ``shardlab.calibrate()`` (``--full``: the full one) and caches
the profile per device set (platform, device kind and count: ``%devices`` switches sets, and
each keeps its own); ``--show`` shows the cached one; ``--save FILE`` / ``--load FILE``
write and read it as JSON; ``--use`` / ``--no-use`` set ``CalibrateMagics.use_by_default``
(also ``%config CalibrateMagics.use_by_default = True``), which makes ``device=None`` — new
searches, ``predict``, the editor, the explorer and the timeline — mean the cached profile
of the current devices.
"""

from __future__ import annotations

import os
import shlex
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from traitlets import Bool

if TYPE_CHECKING:
    from shardlab.kernel.session import ShardlabSession
    from shardlab.parallel.cost.profiles import DeviceProfile

USAGE = "%calibrate [--full] [--show] [--save FILE] [--load FILE] [--use | --no-use]"
_FLAGS = frozenset({"--full", "--show", "--use", "--no-use"})
_WITH_FILE = frozenset({"--save", "--load"})


def device_set() -> tuple[str, str, int]:
    """The current devices: ``(platform, device kind, count)``."""
    import jax

    devices = jax.devices()
    return (str(devices[0].platform), str(devices[0].device_kind), len(devices))


def device_set_of(profile: DeviceProfile) -> tuple[str, str, int] | None:
    c = profile.calibration
    return None if c is None else (c.platform, c.device_kind, c.device_count)


def profile_summary(profile: DeviceProfile) -> str:
    """The profile in words: what priced, the roofline and overhead, and per collective
    kind and group the fitted alpha, achieved bandwidth and residual."""
    from shardlab.parallel.display import human_time

    c = profile.calibration
    lines = [profile.priced_by]
    if c is not None:
        mesh = ", ".join(f"{k}={v}" for k, v in c.mesh.items()) or "-"
        lines.append(
            f"devices {c.devices_text}; axes measured {mesh}; {c.seconds:.1f} s, median of "
            f"{c.runs} runs per figure"
        )
    lines.append(
        f"matmul {profile.peak_flops / 1e9:.3g} GFLOP/s per device"
        + (f" (fit residual {c.matmul_residual:.1%})" if c else "")
        + f"; memory {profile.memory_bandwidth / 1e9:.3g} GB/s per device"
        + (f" (fit residual {c.bandwidth_residual:.1%})" if c else "")
        + f"; compute hides {profile.overlap:.0%} of the memory traffic"
        + (
            f"; narrow convolutions {profile.narrow_convolution:.2g}× slower"
            if profile.narrow_convolution != 1.0
            else ""
        )
        + (
            f"; a convolution with 4 output features per device "
            f"{profile.thin_convolution():.2g}× slower than with 64"
            if profile.feature_overhead
            else ""
        )
    )
    overhead = f"per-op overhead {human_time(profile.op_overhead)}"
    if profile.operand_latency:
        overhead += (
            f"; each operand of a combined collective pays {profile.operand_latency:.0%} "
            "of its latency"
        )
    if c is not None:
        overhead += f"; a program's launch {human_time(c.dispatch)} (not charged per op)"
    lines.append(overhead)
    if profile.collective_fits:
        lines.append(
            f"{'collective':<19} {'axis':<10} {'group':>5} {'alpha':>10} "
            f"{'GB/s':>7} {'residual':>8}"
        )
        for f in profile.collective_fits:
            lines.append(
                f"{f.kind:<19} {f.axis or '-':<10} {f.group_size:>5} "
                f"{human_time(f.alpha):>10} {1 / f.beta / 1e9:>7.3g} {f.residual:>8.1%}"
            )
    else:
        lines.append(
            f"links {profile.link_bandwidth / 1e9:.3g} GB/s, {human_time(profile.link_latency)}"
            " per ring step (no measured fits)"
        )
    return "\n".join(lines)


@magics_class
class CalibrateMagics(Magics):
    """``%calibrate``, bound to one :class:`ShardlabSession`; the cache per device set."""

    use_by_default = Bool(
        False,
        help="Make device=None (new searches, predict, the editor, the explorer, the "
        "timeline) use the %calibrate profile of the current devices.",
    ).tag(config=True)

    def __init__(self, shell: Any, *, session: ShardlabSession, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self.session = session
        self.profiles: dict[tuple[str, str, int], DeviceProfile] = {}
        self.observe(lambda change: self._apply(), names=["use_by_default"])

    def _apply(self) -> None:
        """``use_profile`` follows the setting and the current device set's profile."""
        from shardlab.parallel.cost.profiles import use_profile

        profile = self.profiles.get(device_set())
        use_profile(profile if self.use_by_default else None)

    def cached(self) -> DeviceProfile | None:
        """The profile of the current device set, if one was measured or loaded."""
        return self.profiles.get(device_set())

    @line_magic
    def calibrate(self, line: str) -> None:
        """Measure the devices, or show, save, load or use the profile: ``%calibrate
        [--full] [--show] [--save FILE] [--load FILE] [--use | --no-use]``.

        No option: a quick calibration (under 30 s on 8 simulated CPU devices), cached
        for the current device set and shown. ``--full``: the full one (its estimate is
        said first). ``--show``: the cached profile. ``--save FILE``: write the cached (or
        just measured) profile as JSON. ``--load FILE``: read one (validated; it is cached
        for the device set it was measured on). ``--use`` / ``--no-use``: make new
        searches use the cached profile by default, or the datasheet again (measuring
        first when nothing is cached).
        """
        options = self._parse(line)
        if "--save" in options:
            _check_writable(options["--save"])  # before measuring, not after
        from shardlab.parallel.cost.calibrate import calibrate, load_profile, save_profile

        profile = None
        if "--load" in options:
            try:
                profile = load_profile(options["--load"])
            except (OSError, ValueError) as error:
                raise UsageError(f"%calibrate --load: {error}") from None
            key = device_set_of(profile) or device_set()
            self.profiles[key] = profile
            if key != device_set():
                print(
                    f"note: {options['--load']} was measured on {key[2]} × {key[1]} "
                    f"({key[0]}), not on the current {device_set()[2]} × {device_set()[1]}; "
                    "it is cached for its own device set"
                )
        # Measure with no option, with --full, and for --use or --save with nothing cached.
        measure = (
            not options
            or "--full" in options
            or (bool({"--use", "--save"} & options.keys()) and self.cached() is None)
        )
        if measure:
            profile = calibrate(quick="--full" not in options)
            self.profiles[device_set()] = profile
        profile = profile or self.cached()
        if "--save" in options:
            if profile is None:
                raise UsageError("%calibrate --save: nothing measured yet; run %calibrate first")
            try:
                saved = save_profile(profile, options["--save"])
            except (OSError, ValueError) as error:  # a missing folder, a folder, a NUL byte
                raise UsageError(
                    f"%calibrate --save {options['--save'][:80]!r}: cannot write there "
                    f"({type(error).__name__}: {str(error)[:120]}); give a file path in an "
                    "existing folder, e.g. --save profile.json"
                ) from None
            print(f"saved {saved}")
        if "--use" in options:
            self.use_by_default = True
            self._apply()
        elif "--no-use" in options:
            self.use_by_default = False
        if "--show" in options and profile is None:
            raise UsageError(
                f"%calibrate --show: no profile for {device_set()[2]} × {device_set()[1]} yet; "
                "run %calibrate (or %calibrate --load FILE)"
            )
        if profile is not None and (measure or "--show" in options or "--load" in options):
            print(profile_summary(profile))
        if "--use" in options or "--no-use" in options:
            used = self.cached() if self.use_by_default else None
            print(
                f"new searches use the {used.priced_by}"
                if used is not None
                else "new searches use the backend's datasheet profile"
            )
        self._apply()

    def _parse(self, line: str) -> dict[str, str]:
        try:
            words = shlex.split(line)
        except ValueError as error:
            raise UsageError(f"%calibrate: {error}; usage: {USAGE}") from None
        options: dict[str, str] = {}
        i = 0
        while i < len(words):
            word = words[i]
            if word in _FLAGS:
                options[word] = ""
            elif word in _WITH_FILE:
                if i + 1 >= len(words) or words[i + 1].startswith("--"):
                    raise UsageError(f"%calibrate {word} needs a FILE; usage: {USAGE}")
                options[word] = words[i + 1]
                i += 1
            else:
                raise UsageError(f"%calibrate: unknown option {word!r}; usage: {USAGE}")
            i += 1
        if "--use" in options and "--no-use" in options:
            raise UsageError("%calibrate: --use and --no-use contradict; give one")
        return options


def _check_writable(path: str) -> None:
    """``--save PATH`` names a file that can be written: not a folder, in one that exists.

    Raises:
        UsageError: naming the path and a valid form.
    """
    shown = path if len(path) <= 80 else path[:79] + "…"
    folder = os.path.dirname(os.path.abspath(path)) if "\0" not in path else ""
    if "\0" in path or os.path.isdir(path) or not os.path.isdir(folder):
        why = (
            "a folder" if "\0" not in path and os.path.isdir(path) else "not in an existing folder"
        )
        raise UsageError(
            f"%calibrate --save {shown!r}: {why}; give a file path in an existing folder, "
            "e.g. --save profile.json"
        )
