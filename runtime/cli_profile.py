"""`edgerun profile`: measure every variant of a model and pick the one to run."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

from runtime import __version__, cli_types
from runtime.choice.report import json_safe, profile_table, refused_devices
from runtime.cli_types import Subparsers
from runtime.config.constraints import latency_target_problem
from runtime.config.schema import ConfigError
from runtime.config.source import bundled_names

PROFILE_JSON_SCHEMA = "edgerun.profile/1"

def cmd_profile(args: argparse.Namespace) -> int:
    """Profile every variant of a model and pick the lowest-energy one meeting the target."""
    from power.sensors import detect_meter
    from runtime import config as config_mod
    from runtime.choice.profiler import Profiler, default_threads, profile_all
    from runtime.choice.selector import NoVariantError, frontier, select
    from runtime.device.profiles import load_profile
    from runtime.engine.backends import survey

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
    if args.latency_ms is not None and (why := latency_target_problem(args.latency_ms)):
        raise ConfigError(f"--latency-ms: {why}")
    constraints = replace(  # the command line's over the config's; inference alone
        cons, end_to_end_ms=None,
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
    found = survey(cfg.backends)
    backends = found.backends
    if not backends:
        print("edgerun: no inference backend is usable on this machine", file=sys.stderr)
        for line in missing_lines(found.engines):
            print(line, file=sys.stderr)
        return 2
    threads = cfg.backends.threads or default_threads()

    from power.nvml import gpu_meters
    from runtime.choice.progress import Progress

    profiler = Profiler(prof_cfg, meter, device.name,
                        active_w_per_core=device.power.active_w_per_core,
                        accelerators=device.accelerators, gpu_meters=gpu_meters())
    with Progress() as progress:  # a bar on a terminal, a line a variant when piped
        profiles = profile_all(backends, models, threads, cfg.backends, profiler,
                               fresh=args.fresh, progress=progress,
                               screen=lambda w: hint_accuracy.apply(
                                   w, manifest, prof_cfg.cache_path(), args.fresh))
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
            "engines": [{"name": e.name, "devices": [d.id for d in e.devices],
                         "missing": e.missing or None, "remedy": e.remedy or None}
                        for e in found.engines],
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
        for line in missing_lines(found.engines):
            print(line)
        print(profile_table(profiles, choice, {p.variant_id for p in front},
                            all_rows=args.all))
        print("choice: " + (choice.reason if choice else failure))
        hints = {b.name: getattr(b, "refused_hint", "") for b in backends}
        for (engine, _dev), why in refused_devices(profiles).items():
            print(f"refused: {engine} {why}")  # why names the device
            if hints.get(engine):
                print(f"  what to do: {hints[engine]}")
        if choice and choice.profile.accuracy is None:
            print("accuracy: unknown (a bare .onnx: its fp32 form is the reference; "
                  "`edgerun models prepare` measures a ladder)")
    return 0 if choice is not None else 1


def missing_lines(engines) -> list[str]:
    """Each enabled engine that discovery did not find: why, and what to do (two lines)."""
    out = []
    for e in engines:
        if not e.found:
            out += [f"missing: {e.name}: {e.missing}", f"  what to do: {e.remedy}"]
    return out


def add_profile(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun profile MODEL`."""
    pr = sub.add_parser("profile", help="profile every variant of a model and pick one",
                        description=cmd_profile.__doc__,
                        parents=[common])
    pr.add_argument("model", type=cli_types.model,
                    help="an .onnx file, a model directory with a manifest, or the name of a "
                    f"bundled model ({', '.join(bundled_names())}), from any directory")
    pr.add_argument("--config", type=Path, help="edgerun TOML config (defaults otherwise)")
    pr.add_argument("--latency-ms", type=float, help="latency target (default 20)")
    pr.add_argument("--percentile", type=int, choices=(50, 95, 99), help="default 95")
    pr.add_argument("--accuracy-floor", type=float, help="minimum accuracy (0..1)")
    pr.add_argument("--input-shape", type=cli_types.shape,
                    help="fix dynamic dims, e.g. 1,3,224,224")
    pr.add_argument("--time-budget", type=float, help="seconds of measuring per variant")
    pr.add_argument("--fresh", action="store_true", help="ignore cached profiles and failure "
                    "records: measure everything, try failed variants again")
    pr.add_argument("--engine", action="append", metavar="ENGINE",
                    help="profile only this engine: onnxruntime, openvino, opencv, opencl "
                    "(repeat for more)")
    pr.add_argument("--threads", type=cli_types.threads, help="profile only these thread counts, "
                    "e.g. 1,4")
    pr.add_argument("--all", action="store_true", help="list every variant and every failure "
                    "(default: the choice, the frontier, the 10 cheapest others, failures "
                    "summarised one line per kind)")
    pr.add_argument("--json", action="store_true", help="machine-readable output "
                    f"(schema {PROFILE_JSON_SCHEMA}, see docs/profile-json.md)")
    pr.set_defaults(func=cmd_profile)
