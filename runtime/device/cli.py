"""`edgerun check` and `edgerun serve`: the device's own commands."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from runtime.cli_types import Subparsers
from runtime.config.schema import to_dict


def cmd_check(args: argparse.Namespace) -> int:
    """Validate a config file, print it resolved (stdout, JSON) and report the model, the
    sensors and the inference engines and devices the daemon would use, each missing engine
    with why and what to do (stderr); exit 1 when the model cannot be loaded or the governor
    is on and no temperature sensor is found."""
    from runtime import config as config_mod
    from runtime.frames.stream_url import redact

    cfg = config_mod.load(args.config)
    details: list[str] = []  # stderr, after the resolved config
    found = (("model", _check_model(cfg, details.append)),
             ("sensors", _check_sensors(cfg, details.append)))
    fixes = [fix for _, fix in found if fix]
    if fixes:  # up front, before the long resolved config: what to change (details below)
        print(f"{args.config}: would NOT run on this machine; change:", file=sys.stderr)
        for fix in fixes:
            print(f"  - {fix}", file=sys.stderr)
        print("  (details after the resolved config)", file=sys.stderr, flush=True)
    # stream URLs may carry a camera's password: the printed config is for screens and tickets
    print(redact(json.dumps(to_dict(cfg), indent=2)), flush=True)
    for line in details:
        print(line, file=sys.stderr)
    from runtime.frames.source_check import notes

    for line in notes(cfg):  # never fatal: serve retries a source until it works
        print(line, file=sys.stderr)
    _check_engines(cfg)
    _check_clock(cfg)
    if (line := _sleep_line(cfg)) is not None:
        print(line, file=sys.stderr)
    print(_storage_line(cfg), file=sys.stderr)
    for line in (_mount_line(cfg), _state_disk_line(cfg)):
        if line:
            print(line, file=sys.stderr)
    bad = [what for what, fix in found if fix]
    print(f"{args.config}: " + (f"config ok, {' and '.join(bad)} NOT ok" if bad else "ok"),
          file=sys.stderr)
    return 1 if bad else 0


def _storage_line(cfg) -> str:
    """How long the card lasts at the last measured rate of disk writes (the daemon's health
    history, in the state directory): the card's own (every writer, the filesystem's journal
    included) where it was measured, else the daemon's, with [storage] rated_tbw."""
    from runtime.device.wear import life_days
    from runtime.wire import health_history

    state = Path(cfg.daemon.state_dir).expanduser()
    recs = [r for r in health_history.read(state) if r.get("write_bytes_per_day") is not None]
    if not recs:
        return (f"storage: no rate of disk writes measured yet (the daemon's health history "
                f"in {state} has none: it reports one after a minute of serving)")
    last = recs[-1]
    per_day, card = last["write_bytes_per_day"], last.get("card_write_bytes_per_day")
    line = f"storage: the daemon wrote {per_day / 1e6:.1f} MB a day (its last health)"
    if card is not None:
        line += f", its card {card / 1e6:.1f} MB a day (every writer, the journal included)"
    tbw = cfg.storage.rated_tbw
    days = life_days(card if card is not None else per_day, tbw)
    if days is None:
        return line + "; set [storage] rated_tbw (the card's rated TB written) for its life"
    years = f" ({days / 365:.1f} years)" if days >= 365 else ""  # not "(0.0 years)"
    line += f"; a new {tbw:g} TBW card lasts {days:,.0f} days{years} at that rate"
    if days < SHORT_CARD_DAYS:  # said, never fatal: the rate may be a first minute's
        line = ("WARNING: " + line + f", under {SHORT_CARD_DAYS // 365} years: what writes "
                "is in docs/telemetry.md (\"Disk writes\"; fsync, health_interval_s, the "
                "mount's commit=)")
    return line


SHORT_CARD_DAYS = 3 * 365  # a field box is expected to outlive this


def _mount_line(cfg, mounts: Path = Path("/proc/mounts")) -> str | None:
    """What to change in the mount of the state directory's filesystem to spare the card
    (runtime/device/wear.py mount_advice), or None."""
    from runtime.device.wear import mount_advice, mount_of

    state = Path(cfg.daemon.state_dir).expanduser().resolve()
    while not state.exists() and state != state.parent:  # not made yet: where it will be
        state = state.parent
    try:
        found = mount_of(state, mounts.read_text())
    except OSError:
        return None
    advice = mount_advice(found[1], found[2]) if found else None
    if found is None or advice is None:
        return None
    commit = next((o.partition("=")[2] for o in found[2] if o.startswith("commit=")), "5")
    return (f"storage: the state directory is on {found[0]} ({found[1]}, "
            f"{','.join(found[2])}), whose journal writes each append's metadata to the card "
            f"every {commit} s: mount it with {advice} to spare it (what it saves, measured, "
            'and what it costs at a power cut: docs/telemetry.md, "At the card")')


def _state_disk_line(cfg) -> str | None:
    """What an outbox directory that can make no file (read-only, out of inodes or quota)
    does to `serve` (runtime/telemetry/outbox.py no_new_files), or None."""
    from runtime.telemetry.outbox import no_new_files

    outbox = Path(cfg.telemetry.outbox.path).expanduser()
    if not (why := no_new_files(outbox)):
        return None
    return (f"storage: {outbox.parent} (the outbox's): {why}: `serve` keeps its outbox in "
            "memory there (results not acked when it stops are lost) or, where no outbox ran "
            "before, does not start")


def _check_model(cfg, say: Callable[[str], None]) -> str | None:
    """Load the configured model as `serve` would (manifest and sha256 of every variant, or a
    bare .onnx with its input shape, labels and preprocessing) and `say` what was found. What
    to change when `serve` would fail on it, else None."""
    from runtime.engine.manifest import configured_model, model_files
    from runtime.engine.model_meta import describe
    from runtime.engine.onnx_model import ModelError

    if not cfg.model.path:
        say("model: the bundled models/inspection")
        return None
    try:
        m = configured_model(cfg.model.path, cfg.model)
        forms = model_files(m)
    except ModelError as e:
        say(f"ERROR: model: {e}")
        return (f"[model] path = {cfg.model.path!r}: the model cannot be loaded ({e}); point "
                "it at an .onnx file or a model directory, or leave it empty for the bundled "
                "inspection model")
    if m.bare:
        say(f"model: {m.root}: a bare .onnx, one fp32 form, input {list(forms[0].input_shape)}, "
            f"accuracy unknown (the governor can only cap the frame rate); output "
            f"{m.output}, {len(m.labels) or 'no'} labels, preprocess {m.preprocess.to_dict()}")
    else:
        names = ", ".join(f.precision for f in forms)
        say(f"model: {m.root}: {m.name}, {len(forms)} variants ({names}), accuracy basis "
            f"{m.accuracy_basis}")
        ignored = [k for k in ("labels", "preprocess") if getattr(cfg.model, k)]
        if ignored or cfg.model.output != "scores":
            say(f"  note: [model] {', '.join(ignored or ['output'])} apply to a bare .onnx only;"
                " the manifest declares its own")
    say(f"  preprocess: {describe(m.preprocess.to_dict())} (from {m.preprocess_source}); "
        f"labels: {len(m.labels)} (from {m.labels_source})")
    if m.detect is not None:  # docs/detectors.md
        d = m.detect
        say(f"  detector: {d.format} output, score >= {d.score_threshold}, NMS IoU "
            f"{d.iou_threshold}; results carry boxes and counts; tiling "
            + (f"on (tile {m.tiling.size or 'input'} px, overlap {m.tiling.overlap})"
               if m.tiling else "off"))
    return None


def _check_engines(cfg) -> None:
    """Say, on stderr, which inference engines and devices the daemon would use and, for each
    engine missing, why (library absent, no device, failed to start) and what to do; build the
    OpenCL kernels on each device and name each device whose driver refuses them. Never fatal:
    the daemon runs on the engines it finds."""
    from runtime.engine.backends import survey

    found = survey(cfg.backends, probe=True).engines
    names = [e.name for e in found if e.found]
    print(f"engines: {len(names)} of {len(found)} found" + (f": {', '.join(names)}" if names
                                                           else ""), file=sys.stderr)
    for e in found:
        if not e.found:
            print(f"{e.name}: MISSING: {e.missing}", file=sys.stderr)
            print(f"  what to do: {e.remedy}", file=sys.stderr)
            continue
        refused = dict(e.refused)
        for d in e.devices:
            if d.id in refused:
                print(f"{e.name}: {d.id} REFUSED: {refused[d.id]}", file=sys.stderr)
                print(f"  what to do: {e.remedy}", file=sys.stderr)
            elif e.name == "opencl":  # the one engine whose kernels check builds
                print(f"{e.name}: {d.id} ({d.name}; {d.details.get('driver', '?')}): builds "
                      "the kernels", file=sys.stderr)
            else:
                print(f"{e.name}: {d.id} ({d.name})", file=sys.stderr)


def _sleep_line(cfg) -> str | None:
    """With `[sleep] enabled`, whether this board can sleep as `serve` will judge it
    (runtime/device/sleep.py create: the profile's [states] can_suspend, then the RTC alarm
    and /sys/power/state under the sysfs root); None when sleep is off. Never fatal: serve
    runs awake with a critical sleep_disabled event."""
    from power.suspend import SysfsSuspend
    from runtime.device.profiles import load_profile

    sc = cfg.sleep
    if not sc.enabled:
        return None
    if cfg.simulator.enabled:
        return "sleep: simulated (the simulator stops the process for each sleep)"
    device = load_profile(cfg.device.profile)
    st = device.states
    problems = ([] if st is not None and st.can_suspend else
                [f"device profile {device.name} cannot suspend ([states] can_suspend)"])
    problems = problems or SysfsSuspend(Path(cfg.device.sysfs_root or "/"), sc.rtc).problems()
    if problems:
        return ("sleep: configured but this board cannot sleep: " + "; ".join(problems)
                + "; serve runs awake, with a critical sleep_disabled event (docs/sleep.md)")
    when = f"every {sc.every_s:g} s" if sc.every_s else f"{sc.per_hour:g} an hour"
    return (f"sleep: this board can suspend (RTC {sc.rtc}, /sys/power/state offers mem): "
            f"bursts of {sc.burst} {when}, asleep between them where that costs less")


def _check_clock(cfg) -> None:
    """Whether the wall clock is synced, as the daemon will judge it (never fatal: an
    unsynced clock's messages are stamped and placed later, docs/clocks.md)."""
    from runtime.wire import clock

    root = cfg.device.sysfs_root or "/"
    st = clock.judge(clock.read(root, kernel=root == "/"))
    print(f"clock: {st.state}: {st.reason}" + ("" if st.synced else
          "; results, health and events are stamped unsynced and placed once it is synced "
          "(docs/clocks.md)"), file=sys.stderr)


def _check_sensors(cfg, say: Callable[[str], None]) -> str | None:
    """Probe the sensors under the config's sysfs root and `say` what was found. What to
    change when the governor would run without a thermometer, else None."""
    from power.sensors import SensorError, SensorSet, detect_meter, discover_thermal
    from runtime.device.profiles import load_profile

    if cfg.simulator.enabled:
        say("sensors: not probed (simulator.enabled: the simulator writes the sysfs tree)")
        return None
    device = load_profile(cfg.device.profile)
    root = Path(cfg.device.sysfs_root)
    say(f"sensors under {root} for device profile '{device.name}':")
    fix = None
    try:
        src = discover_thermal(root, device)
    except SensorError as e:
        if cfg.governor.policy != "off":
            say(f"ERROR: governor.policy is '{cfg.governor.policy}' but no temperature sensor "
                f"was found, so the governor could not protect this device: {e}")
            say("  fix: point device.sysfs_root at the real tree, name the sensor in the device "
                "profile ([thermal] zone_type, or hwmon_name + hwmon_label), or set "
                "governor.policy = \"off\"")
            fix = (f"[governor] policy = \"{cfg.governor.policy}\" needs a thermometer and none "
                   f"was found under {root} for device profile '{device.name}': name the "
                   "sensor (the device profile's [thermal] zone_type, or hwmon_name + "
                   "hwmon_label; or [device] sysfs_root), or, where nothing can overheat, "
                   "set [governor] policy = \"off\"")
        else:
            say(f"thermal: none (governor.policy is 'off', so none is needed): {e}")
    else:
        for line in src.describe():
            say(line)
        now = SensorSet(root, src.temp_file).read()
        say(f"  now: {now.temp_c:g} °C" if now.valid else f"  now: {'; '.join(now.problems)}")
    meter = detect_meter(root, device)
    say(f"power: {meter.source}: {meter.where}")
    from power.nvml import gpu_meters

    for gpu in gpu_meters():
        say(f"power: nvml: {gpu.where}")
    for a in device.accelerators:
        say(f"accelerator: '{a.match}' ({a.kind}): {a.idle_w:g} W idle, {a.active_w:g} W busy "
            f"({a.basis}), the bill of its variants where no meter covers it")
    battery = device.sensors.battery or (device.battery.path if device.battery else "")
    solar = device.solar.path if device.solar else ""
    if battery or solar:
        r = SensorSet(root, "", battery, solar).read()
        say(f"battery/solar: {battery or '-'} / {solar or '-'}: "
            + ("ok" if r.valid else "; ".join(r.problems)))
    return fix


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon: inspect frames, govern precision, publish results and health."""
    hold_sighup()
    # before the engines and threads exist: each thread's first malloc makes its arena
    from runtime.device.malloc_arenas import limit_malloc_arenas

    limit_malloc_arenas()
    return serve(args.config, print_results=args.print, reload_pending=lambda: bool(_EARLY_HUP))


def serve(config_path: Path | None, print_results: bool = False,
          reload_pending: Callable[[], bool] = lambda: False) -> int:
    """Entry point of `edgerun serve` (`--print`: `print_results`; `reload_pending`: whether
    a SIGHUP arrived before the daemon's handler was installed)."""
    import logging
    from dataclasses import replace

    from runtime.config import ConfigError, load
    from runtime.device.daemon import Daemon
    from runtime.device.profiling import Stopping
    from runtime.device.systemd import Notifier

    cfg = load(config_path)
    if print_results:
        cfg = replace(cfg, results=replace(cfg.results, print=True))
    daemon = Daemon(cfg, config_path)
    daemon.print_results = print_results
    daemon.signals.install()
    if reload_pending():
        daemon.signals.request_reload()  # as its handler would have done
    try:
        daemon.start()
    except Stopping as e:
        logging.getLogger("edgerun.daemon").info("%s: exiting before start-up finished", e)
        daemon.close_partial()
        return 0
    except OSError as e:
        # a file where a directory belongs, a directory where a file does: the message
        # names the path, which is all the operator needs (a traceback at every restart
        # buried it). One naming no file ("[Errno 22] Invalid argument" from a sleep under
        # libfaketime, an outside run) says nothing without where it came from.
        Notifier().status("start-up failed; see the journal")
        if e.filename is None:
            logging.getLogger("edgerun.daemon").error("start-up failed", exc_info=e)
            raise ConfigError(f"start-up failed: {e} (it names no file: the traceback above "
                              "says where it came from)") from e
        raise ConfigError(f"start-up failed: {e}") from e
    except Exception:
        Notifier().status("start-up failed; see the journal")
        raise
    return daemon.run()


_EARLY_HUP: list[int] = []


def hold_sighup() -> None:
    """Remember a SIGHUP until the daemon installs its own handler. Its default action ends
    the process, and the daemon's handler exists only after the engines are imported and the
    config loaded (0.5 s here, seconds on a Pi): a `reload` then killed it without a word."""
    import signal

    signal.signal(signal.SIGHUP, lambda *_: _EARLY_HUP.append(1))


def add_check(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun check CONFIG`."""
    ck = sub.add_parser("check", help="validate a config file, print it resolved and report "
                        "the sensors the daemon would use (exit 1: governor on, no thermometer)",
                        description=cmd_check.__doc__,
                        parents=[common])
    ck.add_argument("config", type=Path)
    ck.set_defaults(func=cmd_check)


def add_serve(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun serve`."""
    se = sub.add_parser("serve", help="run the daemon", description=cmd_serve.__doc__,
                        parents=[common])
    se.add_argument("--config", type=Path, help="edgerun TOML config (embedded defaults "
                    "otherwise: bundled model, synthetic frames, no broker)")
    se.add_argument("--print", action="store_true", help="one line a result on stdout: UTC "
                    "time, source ref, label, score, variant, rung (also [results] print)")
    se.set_defaults(func=cmd_serve)
