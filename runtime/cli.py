"""The `edgerun` command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict, replace
from pathlib import Path

from runtime import __version__, journal
from runtime.choice.report import json_safe, profile_table
from runtime.config.schema import ConfigError, to_dict

PROFILE_JSON_SCHEMA = "edgerun.profile/1"


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.replace("x", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected dims like 1,3,224,224, got {text!r}") from None
    if any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"every dimension must be positive, got {text!r}")
    return dims


def _ratio(text: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number 0..1, got {text!r}") from None
    if not 0 <= r <= 1:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text!r}")
    return r


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected input heights like 80,64,48, got {text!r}"
                                         ) from None
    if any(n < 16 for n in sizes):
        raise argparse.ArgumentTypeError(f"every size must be at least 16, got {text!r}")
    return sizes


def _threads(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected thread counts like 1,4, got {text!r}"
                                         ) from None
    if any(t < 1 for t in counts):
        raise argparse.ArgumentTypeError(f"every thread count must be >= 1, got {text!r}")
    return counts


def cmd_profile(args: argparse.Namespace) -> int:
    """Profile every variant of a model and pick the lowest-energy one meeting the target."""
    from power.sensors import detect_meter
    from runtime import config as config_mod
    from runtime.choice.profiler import Profiler, default_threads, profile_all
    from runtime.choice.selector import Constraints, NoVariantError, frontier, select
    from runtime.device.profiles import load_profile
    from runtime.engine.backends import discover

    cfg = config_mod.load(args.config)
    if bad := sorted(set(args.engine or ()) - set(config_mod.ENGINES)):
        raise ConfigError(f"--engine {', '.join(bad)}: not an engine (one of "
                          f"{', '.join(config_mod.ENGINES)})")
    if args.engine or args.threads:  # profile only these: a shorter run, a shorter table
        b = cfg.backends
        ort = replace(b.onnxruntime, include_default=b.onnxruntime.include_default
                      and not args.threads)  # its default session picks its own threads
        cfg = replace(cfg, backends=replace(b, enabled=tuple(args.engine or b.enabled),
                                            threads=tuple(args.threads or b.threads),
                                            onnxruntime=ort))
    model_cfg = replace(cfg.model, path=str(args.model),
                        input_shape=args.input_shape or cfg.model.input_shape)
    cons = cfg.constraints
    constraints = Constraints(
        latency_ms=args.latency_ms if args.latency_ms is not None else cons.latency_ms,
        percentile=args.percentile if args.percentile is not None else cons.percentile,
        accuracy_floor=(args.accuracy_floor if args.accuracy_floor is not None
                        else cons.accuracy_floor))
    prof_cfg = cfg.profiler
    if args.time_budget is not None:
        prof_cfg = replace(prof_cfg, time_budget_s=args.time_budget)
    device = load_profile(cfg.device.profile)
    meter = detect_meter(Path(cfg.device.sysfs_root), device)
    from runtime.choice import hint_accuracy
    from runtime.engine.manifest import configured_model
    from runtime.engine.manifest import model_files as forms_of

    manifest = configured_model(model_cfg.path, model_cfg)
    models = forms_of(manifest)
    backends = discover(cfg.backends)
    if not backends:
        print("edgerun: no inference backend is usable on this machine", file=sys.stderr)
        return 2
    threads = cfg.backends.threads or default_threads()

    def progress(i: int, n: int, vid: str) -> None:
        print(f"[{i}/{n}] {vid}", file=sys.stderr, flush=True)

    from power.nvml import gpu_meters

    profiler = Profiler(prof_cfg, meter, device.name,
                        active_w_per_core=device.power.active_w_per_core,
                        accelerators=device.accelerators, gpu_meters=gpu_meters())
    profiles = profile_all(backends, models, threads, cfg.backends, profiler,
                           fresh=args.fresh, progress=progress,
                           screen=lambda w: hint_accuracy.apply(w, manifest,
                                                                prof_cfg.cache_dir, args.fresh))
    front = frontier(profiles)
    try:
        choice = select(profiles, constraints)
    except NoVariantError as e:
        choice = None
        failure = str(e)
    if args.json:
        doc = {
            "schema": PROFILE_JSON_SCHEMA,
            "edgerun": __version__,
            "model": str(args.model),
            "device_profile": device.name,
            "energy_source": meter.source,
            "idle_w": profiler.idle_w(),
            "constraints": asdict(constraints),
            "devices": [{"backend": d.backend, "id": d.id, "name": d.name, **d.details}
                        for b in backends for d in b.devices()],
            "choice": None if choice is None else {
                "variant": choice.profile.variant_id, "met": choice.met, "reason": choice.reason},
            "frontier": [p.variant_id for p in front],
            "variants": [asdict(p) for p in profiles],
        }
        print(json.dumps(json_safe(doc), indent=2, allow_nan=False, default=str))
    else:
        print(f"model {args.model}  device profile {device.name}  energy source {meter.source}"
              f"  idle {profiler.idle_w():.2f} W")
        for b in backends:
            for d in b.devices():
                extra = ", ".join(f"{k} {v}" for k, v in d.details.items() if k != "version")
                print(f"device {b.name}:{d.id} {d.name}" + (f" ({extra})" if extra else ""))
        print(profile_table(profiles, choice, {p.variant_id for p in front},
                            all_rows=args.all))
        print("choice: " + (choice.reason if choice else failure))
        if choice and choice.profile.accuracy is None:
            print("accuracy: unknown (a bare .onnx: its fp32 form is the reference; "
                  "`edgerun models prepare` measures a ladder)")
    return 0 if choice is not None else 1


def cmd_check(args: argparse.Namespace) -> int:
    """Validate a config file, print it resolved (stdout, JSON) and report the model and the
    sensors the daemon would use (stderr); exit 1 when the model cannot be loaded or the
    governor is on and no temperature sensor is found."""
    from runtime import config as config_mod
    from runtime.frames.sources import redact

    cfg = config_mod.load(args.config)
    # stream URLs may carry a camera's password: the printed config is for screens and tickets
    print(redact(json.dumps(to_dict(cfg), indent=2)))
    bad = [what for what, rc in (("model", _check_model(cfg)), ("sensors", _check_sensors(cfg)))
           if rc]
    from runtime.frames.source_check import notes

    for line in notes(cfg):  # never fatal: serve retries a source until it works
        print(line, file=sys.stderr)
    print(f"{args.config}: " + (f"config ok, {' and '.join(bad)} NOT ok" if bad else "ok"),
          file=sys.stderr)
    return 1 if bad else 0


def _check_model(cfg) -> int:
    """Load the configured model as `serve` would (manifest and sha256 of every variant, or a
    bare .onnx with its input shape, labels and preprocessing) and say what was found, on
    stderr. 1 when `serve` would fail on it."""
    from runtime.engine.manifest import configured_model, model_files
    from runtime.engine.model_meta import describe
    from runtime.engine.onnx_model import ModelError

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    if not cfg.model.path:
        say("model: the bundled models/inspection")
        return 0
    try:
        m = configured_model(cfg.model.path, cfg.model)
        forms = model_files(m)
    except ModelError as e:
        say(f"ERROR: model: {e}")
        return 1
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
    return 0


def _check_sensors(cfg) -> int:
    """Probe the sensors under the config's sysfs root and print what was found, on stderr so
    stdout stays the resolved config. 1 when the governor would run without a thermometer."""
    from power.sensors import SensorError, SensorSet, detect_meter, discover_thermal
    from runtime.device.profiles import load_profile

    def say(line: str) -> None:
        print(line, file=sys.stderr)

    if cfg.simulator.enabled:
        say("sensors: not probed (simulator.enabled: the simulator writes the sysfs tree)")
        return 0
    device = load_profile(cfg.device.profile)
    root = Path(cfg.device.sysfs_root)
    say(f"sensors under {root} for device profile '{device.name}':")
    rc = 0
    try:
        src = discover_thermal(root, device)
    except SensorError as e:
        if cfg.governor.policy != "off":
            say(f"ERROR: governor.policy is '{cfg.governor.policy}' but no temperature sensor "
                f"was found, so the governor could not protect this device: {e}")
            say("  fix: point device.sysfs_root at the real tree, name the sensor in the device "
                "profile ([thermal] zone_type, or hwmon_name + hwmon_label), or set "
                "governor.policy = \"off\"")
            rc = 1
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
    return rc


def cmd_models(args: argparse.Namespace) -> int:
    """Make a model's precision ladder (fp16, int8, reduced resolution) with measured accuracy.
    Every failure is one error line naming the model and the step (exit 2)."""
    if getattr(args, "ota", None):  # bundle / verify / install / ls (runtime/ota/install.py)
        return args.ota(args)
    from runtime.engine.manifest import Preprocess, read_labels, read_preprocess
    from runtime.engine.model_meta import describe
    from runtime.engine.onnx_model import ModelError
    from runtime.engine.prepare import PrepareOptions, StepError, prepare

    def error(step: str, message: str) -> int:
        print(f"edgerun models prepare: ERROR: {args.model}: step {step}: {message}",
              file=sys.stderr)
        return 2

    try:  # without --preprocess: the model's metadata, else the one default (prepare says)
        preprocess = Preprocess.from_dict(read_preprocess(args.preprocess), str(
            args.preprocess)) if args.preprocess else None
        labels = read_labels(args.labels) if args.labels else ()
    except (ModelError, TypeError) as e:
        return error("options", str(e))
    opts = PrepareOptions(name=args.name or args.out.name, preprocess=preprocess,
                          preprocess_source=f"file {args.preprocess}",
                          labels_source=f"file {args.labels}",
                          check_reference=not args.no_reference_check,
                          labels=labels, input_shape=args.input_shape or (), prefix=args.prefix,
                          output=args.output, reduced=not args.no_reduced,
                          sizes=tuple(args.sizes or ()), task=args.task,
                          format=args.format, score_threshold=args.score_threshold,
                          iou_threshold=args.iou_threshold,
                          **({} if args.min_accuracy_ratio is None else
                             {"min_accuracy_ratio": args.min_accuracy_ratio}))
    try:
        doc = prepare(args.model, args.calib, args.val, args.out, opts,
                      progress=lambda m: print(f"[{m}]", file=sys.stderr, flush=True))
    except StepError as e:
        return error(e.step, e.message)
    except (ValueError, OSError) as e:  # ModelError, or an unreadable --prefix manifest
        return error("manifest", str(e))
    print(f"{'VARIANT':<18} {'ACCURACY':>8} {'AGREE':>7} {'MAX|DIFF|':>10} {'KB':>7}")
    for v in doc["variants"]:
        diff = "-" if v["max_abs_diff"] is None else f"{v['max_abs_diff']:.2e}"
        print(f"{v['name']:<18} {v['accuracy']:>8.4f} {v['agreement']:>7.4f} "
              f"{diff:>10} {v['size_bytes'] / 1024:>7.1f}")
    for f in doc["failed"]:
        what = "SKIPPED" if f.get("skipped") else "FAILED"
        print(f"{what} {args.model.name} {f['variant']} (step {f['step']}): {f['error']}")
    basis = {"labels": "top-1 against the val images' folder names",
             "agreement": "top-1 agreement with fp32 on the val images",
             "agreement-generated": "top-1 agreement with fp32 on generated inputs, not images"}
    if "postprocess" in doc:  # a detector: accuracy is mAP@0.5 (docs/detectors.md)
        basis = {"labels": "mAP@0.5 against the label files",
                 "agreement": "mAP@0.5 against fp32's detections on the val images",
                 "agreement-generated": "mAP@0.5 against fp32's detections on generated "
                                        "inputs, not images"}
    made = doc.get("made_with", {})
    print(f"preprocess: {describe(doc['preprocess'])} (from {made.get('preprocess', '?')}); "
          f"labels: {len(doc['labels'])} (from {made.get('labels', '?')}); fp32 reference: "
          f"{made.get('reference', {}).get('seen', '?')}")
    print(f"manifest: {args.out / 'manifest.json'} (accuracy basis: {doc['accuracy_basis']}: "
          f"{basis.get(doc['accuracy_basis'], '')}, {doc['eval_images']} inputs)")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the daemon: inspect frames, govern precision, publish results and health."""
    _hold_sighup()
    from runtime.device.daemon import serve

    return serve(args.config, print_results=args.print, reload_pending=lambda: bool(_EARLY_HUP))


_EARLY_HUP: list[int] = []


def _hold_sighup() -> None:
    """Remember a SIGHUP until the daemon installs its own handler. Its default action ends
    the process, and the daemon's handler exists only after the engines are imported and the
    config loaded (0.5 s here, seconds on a Pi): a `reload` then killed it without a word."""
    import signal

    signal.signal(signal.SIGHUP, lambda *_: _EARLY_HUP.append(1))


def cmd_demo(args: argparse.Namespace) -> int:
    """Broker, coordinator and daemon on the bundled model with a simulated hot device."""
    from runtime.tools.demo import run

    return run(duration_s=args.duration, device=args.device, scenario=args.scenario,
               speed=args.speed, start_hour=args.start_hour, rate=args.rate)


def cmd_coordinator(args: argparse.Namespace) -> int:
    """Run the coordinator: store fleet results and health, ack, serve the API, send commands."""
    import signal
    import time

    from runtime import config as config_mod
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    cfg = config_mod.load(args.config).coordinator
    if not cfg.broker.host:
        print("edgerun: coordinator.broker.host is not set", file=sys.stderr)
        return 2
    from runtime.coordinator.webhooks import SecretError

    try:
        coordinator = Coordinator(cfg)
    except SecretError as e:
        raise ConfigError(f"coordinator.webhook_secret_file: {e}") from e
    except ValueError as e:  # an unreadable signing key
        raise ConfigError(f"coordinator.signing_key: {e}") from e
    from runtime.coordinator.api import ensure_token, token_path

    try:
        token = ensure_token(token_path(cfg))
    except OSError as e:  # unreadable, or readable by others (PermissionError)
        raise ConfigError(f"coordinator.api_token_file: {e}") from e
    _check_listen(cfg.http_host, cfg.http_port)
    coordinator.start()
    try:
        server = serve(coordinator, cfg.http_host, cfg.http_port, token=token)
    except OSError as e:  # taken since the check above
        coordinator.stop()
        raise ConfigError(f"coordinator.http_port: cannot listen on {cfg.http_host}:"
                          f"{cfg.http_port}: {e.strerror or e}") from e
    logging.getLogger("edgerun").info("coordinator API on http://%s:%d/api/v1/fleet, "
                                      "dashboard on / and Prometheus /metrics (token: %s)",
                                      *server.server_address[:2], token_path(cfg))
    # The handler only sets a flag: Event.set() in a handler can deadlock against the main
    # thread's own Event.wait (both take the same lock).
    stop, hup = [False], [False]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.__setitem__(0, True))
    # SIGHUP's default action ends the process: a `kill -HUP` (or a reload habit) took the
    # fleet's coordinator down. It has no reload; say so and carry on.
    signal.signal(signal.SIGHUP, lambda *_: hup.__setitem__(0, True))
    while not stop[0]:
        time.sleep(0.1)
        if hup[0]:
            hup[0] = False
            logging.getLogger("edgerun").warning(
                "SIGHUP: the coordinator does not reload its config; still running with the "
                "one it started with (restart it to apply changes)")
    server.shutdown()
    coordinator.stop()
    return 0


def _check_listen(host: str, port: int) -> None:
    """ConfigError unless the API's address is free, checked before the coordinator logs in
    to the broker: a second coordinator started on a busy port (the service already running)
    took over the running one's MQTT session, then died with a traceback."""
    import socket

    if not port:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            s.bind(infos[0][4])
    except OSError as e:
        raise ConfigError(f"coordinator.http_port: cannot listen on {host}:{port}: "
                          f"{e.strerror or e} (is another coordinator running?); nothing was "
                          "started") from e


def cmd_fleet(args: argparse.Namespace) -> int:
    """Fleet views and commands through a coordinator's API."""
    if args.fleet_command == "enroll":
        return cmd_enroll(args)
    if args.fleet_command == "revoke":
        return cmd_revoke(args)
    if args.fleet_command == "acl":
        from runtime.coordinator.enroll import refresh_acl

        try:
            print(refresh_acl(args.broker_dir))
        except (ValueError, OSError) as e:
            print(f"edgerun fleet acl: {e}", file=sys.stderr)
            return 2
        return 0
    from runtime.coordinator.client import fleet_command

    return fleet_command(args)


def cmd_revoke(args: argparse.Namespace) -> int:
    """Remove a broker user (its password and ACL lines) from the broker directory."""
    from runtime.coordinator.enroll import RELOAD_HINT
    from runtime.wire.brokerauth import BrokerAuth, device_username

    name = args.name if args.role != "device" else device_username(args.fleet, args.name)
    if not BrokerAuth(args.broker_dir).remove(name):
        print(f"edgerun fleet revoke: no broker user {name!r} in {args.broker_dir}",
              file=sys.stderr)
        return 1
    print(f"revoked broker user {name!r}; next: {RELOAD_HINT} (Mosquitto then disconnects it)")
    return 0


def cmd_enroll(args: argparse.Namespace) -> int:
    """Make a device's (or coordinator's) broker credential, keys and config section."""
    from runtime.coordinator.enroll import (
        RELOAD_HINT,
        enroll_client,
        enroll_coordinator,
        enroll_device,
    )

    try:
        if args.role == "client":
            done = enroll_client(args.name, args.broker_dir, args.out, tuple(args.read),
                                 tuple(args.write))
        elif args.role == "coordinator":
            done = enroll_coordinator(args.name, args.fleet, args.broker_dir, args.out,
                                      args.host, args.port, args.install_dir, args.device_keys)
        else:
            if not args.device_keys:
                print("edgerun fleet enroll: --device-keys DIR (the coordinator's "
                      "coordinator.device_keys directory) is required for a device",
                      file=sys.stderr)
                return 2
            done = enroll_device(args.fleet, args.name, args.broker_dir, args.out,
                                 args.device_keys, args.host, args.port, args.install_dir,
                                 args.command_key, tuple(args.read), args.homeassistant)
    except (ValueError, OSError) as e:
        print(f"edgerun fleet enroll: {e}", file=sys.stderr)
        return 2
    print(f"enrolled broker user {done.username!r}")
    for what, path in done.files.items():
        print(f"  {what:<10} {path}")
    print(f"\n{done.config}\nnext: {RELOAD_HINT}; copy the files in {args.out} to the "
          + args.role + " (keep the secrets there 0600)")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Render one device's timeline (temperature and trips, rung, rate, latency, energy,
    battery) to PNG and optionally HTML, from the coordinator or the device's own state
    (docs/report.md). Needs matplotlib: pip install 'edgerun[report]'."""
    from runtime.tools.day_report import command

    return command(args)


def cmd_schemas(args: argparse.Namespace) -> int:
    """Print the MQTT payload JSON Schemas (v1), keyed by message kind."""
    from runtime.wire.payloads import SCHEMAS

    print(json.dumps(SCHEMAS, indent=2))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Make an Ed25519 key pair for signing commands (private key mode 0600). An existing key
    file is never replaced without --force: the devices trusting it would refuse every
    command signed by the new one."""
    from runtime.wire.commands import generate_keypair

    existing = [str(f) for f in (args.private, args.public) if f.exists() or f.is_symlink()]
    if existing and not args.force:
        verb = "exists" if len(existing) == 1 else "exist"
        print(journal.error_line(
            f"edgerun keys: {' and '.join(existing)} already {verb}; refusing to overwrite "
            "(devices that trust the old key would refuse commands signed by a new one). "
            "Pass --force to replace it."), file=sys.stderr)
        return 2
    try:
        kid = generate_keypair(args.private, args.public, overwrite=args.force)
    except FileExistsError as e:  # appeared since the check above
        print(journal.error_line(f"edgerun keys: {e.filename} already exists; refusing to "
                                 "overwrite it (pass --force to replace it)"), file=sys.stderr)
        return 2
    print(f"key {kid}: private {args.private} (keep on the coordinator), "
          f"public {args.public} (list in telemetry.trusted_keys on devices)")
    return 0


def _fleet_options(p: argparse.ArgumentParser, default: object) -> None:
    """The fleet views' options; `default` None on `fleet` itself, SUPPRESS on its actions
    (see build_parser)."""
    def d(value: object) -> object:
        return value if default is None else default

    p.add_argument("--api", default=d(None), help="coordinator API base URL (default: from "
                   "--config, else http://127.0.0.1:8787)")
    p.add_argument("--token-file", type=Path, default=d(None), help="the coordinator's API "
                   "token file (default: from --config, else $EDGERUN_API_TOKEN_FILE, else "
                   "~/.local/state/edgerun/api-token)")
    p.add_argument("--config", type=Path, default=d(None), help="the coordinator's config: "
                   "API address and token file")
    p.add_argument("--json", action="store_true", default=d(False), help="print the raw JSON")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    p = argparse.ArgumentParser(prog="edgerun", description="Edge inference runtime.")
    p.add_argument("--version", action="version", version=f"edgerun {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # Global options are accepted after the subcommand too (`edgerun serve --config X -v`,
    # `edgerun fleet ls --json`): every subparser repeats them with a SUPPRESSed default, so
    # an option given at any level sets the value and one not given leaves the outer default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pr = sub.add_parser("profile", help="profile every variant of a model and pick one",
                        description=cmd_profile.__doc__,
                        parents=[common])
    pr.add_argument("model", type=Path, help="an .onnx file or a model directory with a manifest")
    pr.add_argument("--config", type=Path, help="edgerun TOML config (defaults otherwise)")
    pr.add_argument("--latency-ms", type=float, help="latency target (default 20)")
    pr.add_argument("--percentile", type=int, choices=(50, 95, 99), help="default 95")
    pr.add_argument("--accuracy-floor", type=float, help="minimum accuracy (0..1)")
    pr.add_argument("--input-shape", type=_shape, help="fix dynamic dims, e.g. 1,3,224,224")
    pr.add_argument("--time-budget", type=float, help="seconds of measuring per variant")
    pr.add_argument("--fresh", action="store_true", help="ignore cached profiles and failure "
                    "records: measure everything, try failed variants again")
    pr.add_argument("--engine", action="append", metavar="ENGINE",
                    help="profile only this engine: onnxruntime, openvino, opencv, opencl "
                    "(repeat for more)")
    pr.add_argument("--threads", type=_threads, help="profile only these thread counts, "
                    "e.g. 1,4")
    pr.add_argument("--all", action="store_true", help="list every variant and every failure "
                    "(default: the choice, the frontier, the 10 cheapest others, failures "
                    "summarised one line per kind)")
    pr.add_argument("--json", action="store_true", help="machine-readable output "
                    f"(schema {PROFILE_JSON_SCHEMA}, see docs/profile-json.md)")
    pr.set_defaults(func=cmd_profile)

    ck = sub.add_parser("check", help="validate a config file, print it resolved and report "
                        "the sensors the daemon would use (exit 1: governor on, no thermometer)",
                        description=cmd_check.__doc__,
                        parents=[common])
    ck.add_argument("config", type=Path)
    ck.set_defaults(func=cmd_check)

    se = sub.add_parser("serve", help="run the daemon", description=cmd_serve.__doc__,
                        parents=[common])
    se.add_argument("--config", type=Path, help="edgerun TOML config (embedded defaults "
                    "otherwise: bundled model, synthetic frames, no broker)")
    se.add_argument("--print", action="store_true", help="one line a result on stdout: UTC "
                    "time, source ref, label, score, variant, rung (also [results] print)")
    se.set_defaults(func=cmd_serve)

    de = sub.add_parser("demo", help="everything on one machine, with a live view",
                        description=cmd_demo.__doc__,
                        parents=[common])
    de.add_argument("--duration", type=float, default=0.0, help="seconds (default: until ^C)")
    de.add_argument("--device", default="rpi5", help="simulated device profile")
    de.add_argument("--scenario", default="cabinet",
                    choices=("cool", "warm", "hot", "sun", "cabinet"))
    de.add_argument("--speed", type=float, default=480.0, help="simulated seconds per second")
    de.add_argument("--start-hour", type=float, default=10.0, help="simulated time of day")
    de.add_argument("--rate", type=float, default=100.0, help="conveyor frames per second")
    de.set_defaults(func=cmd_demo)

    mo = sub.add_parser("models", help="model ladders", description=cmd_models.__doc__,
                        parents=[common])
    msub = mo.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    mp = msub.add_parser("prepare", help="make fp16/int8/reduced variants and a manifest",
                         parents=[common])
    mp.add_argument("model", type=Path, help="the fp32 .onnx model")
    mp.add_argument("--calib", type=Path, help="images for int8 calibration (default: the "
                    "--val images; without either, no int8)")
    mp.add_argument("--val", type=Path,
                    help="images to measure on: labelled (parent folder = label, with --labels) "
                    "or not (accuracy = agreement with fp32); none: fp16 only, on generated "
                    "inputs")
    mp.add_argument("--labels", type=Path, help="class names, one per line, in output order")
    mp.add_argument("--out", type=Path, required=True, help="output directory")
    mp.add_argument("--name", help="model name (default: the output directory's name)")
    mp.add_argument("--prefix", default="",
                    help="add this model's variants to the manifest in --out as PREFIX-...")
    mp.add_argument("--input-shape", type=_shape, help="fix dynamic dims, e.g. 1,3,224,224")
    mp.add_argument("--preprocess", type=Path,
                    help="JSON with layout/colour/resize/scale/mean/std (default: what the "
                    "model's metadata says, else RGB pixels / 255, as for a bare .onnx)")
    mp.add_argument("--output", choices=("probabilities", "logits"), default="probabilities")
    mp.add_argument("--no-reduced", action="store_true", help="skip the reduced-resolution form")
    mp.add_argument("--sizes", type=_sizes, help="reduced-resolution forms at these input "
                    "heights, e.g. 80,64,48 (default: one at 2/3 for a classifier, 0.8/0.7/0.5 "
                    "of the input for a detector)")
    mp.add_argument("--task", choices=("auto", "classify", "detect"), default="auto",
                    help="auto: from the output's shape (docs/detectors.md)")
    mp.add_argument("--format", choices=("auto", "yolov8", "yolov5", "nms-inside"),
                    default="auto", help="a detector's output form")
    mp.add_argument("--score-threshold", type=float, default=0.25, help="detector boxes kept")
    mp.add_argument("--iou-threshold", type=float, default=0.45, help="detector NMS overlap")
    mp.add_argument("--no-reference-check", action="store_true",
                    help="write the ladder even when the fp32 reference looks blind on the "
                    "val images (no boxes, one class, constant or NaN outputs)")
    mp.add_argument("--min-accuracy-ratio", type=_ratio, default=None,
                    help="a form measured below this x fp32's accuracy is not written as a "
                    "rung (default 0.5; 0 keeps every form)")
    from runtime.ota.install import add_parsers as ota_parsers

    ota_parsers(msub, common)
    mo.set_defaults(func=cmd_models)

    co = sub.add_parser("coordinator", help="run the fleet coordinator",
                        description=cmd_coordinator.__doc__,
                        parents=[common])
    co.add_argument("--config", type=Path, required=True)
    co.set_defaults(func=cmd_coordinator)

    fl = sub.add_parser("fleet", help="fleet views and commands (via the coordinator API)",
                        description=cmd_fleet.__doc__,
                        parents=[common])
    _fleet_options(fl, None)
    fleet_opts = argparse.ArgumentParser(add_help=False)  # the same, after the action
    _fleet_options(fleet_opts, argparse.SUPPRESS)
    fsub = fl.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    fsub.add_parser("ls", help="every device with status and alerts",
                    parents=[common, fleet_opts])
    fs = fsub.add_parser("show", help="one device in detail",
                         parents=[common, fleet_opts])
    fs.add_argument("device")
    fc = fsub.add_parser("send", help="send a signed command and print the reply",
                         parents=[common, fleet_opts])
    fc.add_argument("device")
    fc.add_argument("cmd", help="ping, rebirth, reprofile, set_latency_target ms=20, "
                    "set_accuracy_floor value=0.9, set_rate fps=5, choose_model name=N")
    fc.add_argument("kv", nargs="*", metavar="ARG=VALUE")
    fc.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the reply")
    fd = fsub.add_parser("deploy", help="roll a model bundle out to a group (canary first)",
                         parents=[common, fleet_opts])
    fd.add_argument("bundle", help="a bundle file (uploaded) or NAME@VERSION already held")
    fd.add_argument("--to", required=True, help="a device group, or `all`")
    fd.add_argument("--canary", default="10%", help="share of the group that gets it first "
                    "(0%% or 100%%: all at once)")
    fd.add_argument("--wait", type=float, default=0.0, help="follow the rollout this many "
                    "seconds (exit 1 when it halts)")
    fg = fsub.add_parser("group", help="put devices in a group", parents=[common, fleet_opts])
    fg.add_argument("group")
    fg.add_argument("devices", nargs="+")
    fo = fsub.add_parser("rollouts", help="rollouts and their devices' states",
                         parents=[common, fleet_opts])
    fo.add_argument("id", nargs="?")
    from runtime.coordinator.client import add_bundles_parser

    add_bundles_parser(fsub, [common, fleet_opts])
    fe = fsub.add_parser("enroll", help="make a device's broker credential, keys and config",
                         description=cmd_enroll.__doc__,
                         parents=[common])
    fe.add_argument("name", help="device id (or coordinator name with --role coordinator)")
    fe.add_argument("--fleet", default="default")
    fe.add_argument("--role", choices=("device", "coordinator", "client"), default="device",
                    help="client: only the --read/--write topics (e.g. a camera's trigger)")
    fe.add_argument("--broker-dir", type=Path, required=True,
                    help="directory of the broker's passwd/acl files (mosquitto.conf: "
                    "password_file DIR/passwd, acl_file DIR/acl)")
    fe.add_argument("--out", type=Path, required=True,
                    help="where to write the credential, keys and config section")
    fe.add_argument("--device-keys", type=Path,
                    help="the coordinator's device_keys directory (gets <device>.pub)")
    fe.add_argument("--host", default="127.0.0.1", help="broker host for the config section")
    fe.add_argument("--port", type=int, default=1883, help="broker port for the config section")
    fe.add_argument("--install-dir", type=Path,
                    help="where the files will live on the target (default: --out)")
    fe.add_argument("--command-key", type=Path,
                    help="the coordinator's command-signing public key (trusted_keys)")
    fe.add_argument("--read", action="append", default=[], metavar="TOPIC",
                    help="extra topic the device may receive (an MQTT trigger topic)")
    fe.add_argument("--homeassistant", nargs="?", const="homeassistant", default="",
                    metavar="PREFIX", help="(device) allow publishing Home Assistant discovery "
                    "configs under PREFIX (default homeassistant; docs/homeassistant.md)")
    fe.add_argument("--write", action="append", default=[], metavar="TOPIC",
                    help="(--role client) topic it may publish")
    fr = fsub.add_parser("revoke", help="remove a device's (or coordinator's) broker user",
                         description=cmd_revoke.__doc__,
                         parents=[common])
    fr.add_argument("name", help="device id (or coordinator name with --role coordinator)")
    fr.add_argument("--fleet", default="default")
    fr.add_argument("--role", choices=("device", "coordinator", "client"), default="device")
    fr.add_argument("--broker-dir", type=Path, required=True)
    fa = fsub.add_parser("acl", help="regenerate the broker ACL from the enrolled identities "
                         "when an older version wrote it", parents=[common])
    fa.add_argument("--broker-dir", type=Path, required=True)
    fl.set_defaults(func=cmd_fleet)

    rp = sub.add_parser("report", help="one device's day as PNG (and HTML): temperature, "
                        "rung, rate, latency, energy, battery", description=cmd_report.__doc__,
                        parents=[common])
    rp.add_argument("device", nargs="?", help="device id (default with --local: this box's)")
    rp.add_argument("--local", action="store_true", help="from this box's own state directory "
                    "(health-history.jsonl) instead of the coordinator")
    rp.add_argument("--state-dir", type=Path, help="(--local) the daemon's state_dir "
                    "(default: from --config)")
    rp.add_argument("--config", type=Path, help="the coordinator's config (API address and "
                    "token), or with --local the device's config (state_dir, device id)")
    rp.add_argument("--api", help="coordinator API base URL (default: from --config, else "
                    "http://127.0.0.1:8787)")
    rp.add_argument("--token-file", type=Path, help="the coordinator's API token file")
    rp.add_argument("--since", default="24h", help="start: 24h, 90m, 2d, epoch seconds or "
                    "ISO time (default 24h)")
    rp.add_argument("--until", help="end (default now), same forms as --since")
    rp.add_argument("--out", type=Path, help="PNG file (default DEVICE-report.png)")
    rp.add_argument("--html", type=Path, help="also write an HTML page (PNG embedded, a row "
                    "per hour)")
    rp.add_argument("--utc", action="store_true", help="times in UTC (default: local time)")
    rp.set_defaults(func=cmd_report)

    sc = sub.add_parser("schemas", help="print the MQTT payload JSON Schemas",
                        description=cmd_schemas.__doc__,
                        parents=[common])
    sc.set_defaults(func=cmd_schemas)

    ky = sub.add_parser("keys", help="make an Ed25519 command-signing key pair",
                        description=cmd_keys.__doc__,
                        parents=[common])
    ky.add_argument("--private", type=Path, required=True)
    ky.add_argument("--public", type=Path, required=True)
    ky.add_argument("--force", action="store_true",
                    help="replace existing key files (devices trusting the old key will "
                    "refuse commands signed by the new one)")
    ky.set_defaults(func=cmd_keys)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `edgerun` console script."""
    args = build_parser().parse_args(argv)
    if args.func is cmd_serve:
        _hold_sighup()  # before the imports below: they load numpy and onnx
    from runtime.choice.selector import NoVariantError
    from runtime.engine.onnx_model import ModelError

    if journal.setup(logging.DEBUG if args.verbose else logging.INFO):
        # An uncaught exception's traceback is a crash: filed at CRIT, every line of it.
        sys.excepthook = lambda t, v, tb: logging.getLogger("edgerun").critical(
            "uncaught exception, exiting", exc_info=(t, v, tb))
    try:
        return args.func(args)
    except (ConfigError, ModelError, NoVariantError) as e:
        print(journal.error_line(f"edgerun: {e}"), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
