"""`edgerun fleet ...`: a thin client of the coordinator's JSON API.

It authenticates with the coordinator's API token, read from `--token-file`, else from the
token file of the coordinator config given with `--config` (which also gives the API
address), else from $EDGERUN_API_TOKEN_FILE, else `~/.local/state/edgerun/api-token` (the
default store's directory)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from runtime.coordinator import views

DEFAULT_API = "http://127.0.0.1:8787"
DEFAULT_TOKEN_FILE = "~/.local/state/edgerun/api-token"


def resolve(args: argparse.Namespace) -> tuple[str, Path]:
    """(API base URL, token file) from --api/--token-file/--config/environment/defaults."""
    api, token_file = args.api, args.token_file
    if args.config:
        from runtime import config as config_mod
        from runtime.coordinator.api import token_path

        cfg = config_mod.load(args.config).coordinator
        api = api or f"http://{cfg.http_host}:{cfg.http_port}"
        token_file = token_file or token_path(cfg)
    token_file = token_file or os.environ.get("EDGERUN_API_TOKEN_FILE") or DEFAULT_TOKEN_FILE
    return api or DEFAULT_API, Path(token_file).expanduser()


def read_token(path: Path) -> str:
    """The API token from its file, or exit with what to do."""
    try:
        return path.read_text().strip()
    except OSError as e:
        raise SystemExit(f"edgerun fleet: cannot read the API token {path}: {e.strerror} "
                         "(pass --token-file, or --config with the coordinator's config; the "
                         "coordinator makes the file at its first start)") from None


class ApiError(Exception):
    """A call of the coordinator's API that failed: `status` is the HTTP status (None when no
    answer came: refused, reset, timed out), `route` the method and path, `reason` the
    server's `error` text (else the HTTP reason, or the connection's error), `api` the base
    URL called."""

    def __init__(self, api: str, route: str, status: int | None, reason: str):
        self.api, self.route, self.status, self.reason = api, route, status, reason
        super().__init__(f"{route}: HTTP {status}: {reason}" if status is not None else
                         f"{route}: cannot reach the coordinator at {api}: {reason}")


def _send(api: str, path: str, method: str, data: Any, headers: dict[str, str],
          timeout: float) -> Any:
    """One exchange: the parsed JSON answer, or ApiError (chained to what failed)."""
    route = f"{method} {path}"
    req = urllib.request.Request(api.rstrip("/") + path, data=data, method=method,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        try:
            detail = json.loads(e.read() or b"{}").get("error", e.reason)
        except (ValueError, AttributeError):
            detail = e.reason
        raise ApiError(api, route, e.code, str(detail)) from e
    except urllib.error.URLError as e:  # no connection: refused, unresolvable, timed out
        raise ApiError(api, route, None, str(e.reason)) from e
    except OSError as e:  # the connection failed after it was made (reset, read timeout)
        raise ApiError(api, route, None, str(e)) from e


def call(api: str, path: str, body: dict | None = None, *, token: str = "",
         method: str = "", timeout: float = 30) -> Any:
    """Call `path` of the coordinator's API at `api` (a POST of `body` as JSON when given,
    else a GET, unless `method` says): its JSON answer. Raises ApiError on an HTTP error or
    when the coordinator cannot be reached."""
    method = method or ("POST" if body is not None else "GET")
    return _send(api, path, method, None if body is None else json.dumps(body).encode(),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
                 timeout)


def upload(api: str, bundle: Path, token: str, timeout: float = 600) -> Any:
    """PUT the bundle file `bundle` to the coordinator (streamed): the record it keeps.
    Raises OSError when the file cannot be opened, ApiError when the coordinator refuses it
    or cannot be reached."""
    size = bundle.stat().st_size
    with bundle.open("rb") as f:
        return _send(api, "/api/v1/bundles", "PUT", f,
                     {"Content-Length": str(size), "Authorization": f"Bearer {token}",
                      "Content-Type": "application/octet-stream"}, timeout)


def _call(api: str, path: str, body: dict | None = None, timeout: float = 30,
          token: str = "", method: str = "") -> Any:
    """`call` for the CLI: an error exits with the reason (SystemExit)."""
    try:
        return call(api, path, body, token=token, method=method, timeout=timeout)
    except ApiError as e:
        if e.status is not None:
            raise SystemExit(f"edgerun fleet: {e.reason} (HTTP {e.status})") from None
        raise SystemExit(f"edgerun fleet: cannot reach the coordinator at {api}: {e.reason}"
                         ) from None


def parse_args_kv(pairs: list[str]) -> dict[str, Any]:
    """`ms=20 name=inspection` -> {"ms": 20, "name": "inspection"} (numbers parsed as JSON)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"edgerun fleet: expected ARG=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _upload(api: str, path: Path, token: str) -> dict:
    """`upload` for `fleet deploy`: an error exits with the reason (SystemExit)."""
    try:
        return upload(api, path, token)
    except ApiError as e:
        if e.status is not None:
            raise SystemExit(f"edgerun fleet deploy: {e.reason} (HTTP {e.status})") from None
        # the words the connection's own error gives, after the file they were about
        raise SystemExit(f"edgerun fleet deploy: {path}: {e.__cause__}") from None
    except OSError as e:
        raise SystemExit(f"edgerun fleet deploy: {path}: {e}") from None


def _rollout_line(r: dict) -> str:
    st = r["devices"]
    counts = {}
    for d in st.values():
        counts[d["state"]] = counts.get(d["state"], 0) + 1
    return (f"rollout {r['id']} {r['version']} -> {r['group']}: {r['state'].upper()}  "
            + " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            + (f"  ({r['reason']})" if r.get("reason") else ""))


def _away(api: str, token: str, devices: list[str]) -> list[str]:
    """A line for each of `devices` the coordinator sees offline or asleep: what becomes of
    the deploy it was just sent (none when the fleet view cannot be read: the rollout's own
    lines still follow)."""
    import time

    try:
        rows = call(api, "/api/v1/fleet", token=token, timeout=10)
    except ApiError:
        return []
    by = {r.get("device"): r for r in rows if isinstance(r, dict)}

    def hm(t: object) -> str:
        return time.strftime("%H:%M", time.localtime(t)) if isinstance(t, int | float) \
            and t > 0 else "never"

    out = []
    for d in devices:
        v = by.get(d) or {}
        if v.get("status") == "offline":
            out.append(f"  {d}: offline (last seen {hm(v.get('last_seen'))}): it runs the "
                       f"deploy when {d} is back (the coordinator sends a returning device its "
                       "desired model); without a verdict within the coordinator's "
                       "rollout_timeout_s of the deploy it counts as failed")
        elif v.get("status") == "asleep":
            out.append(f"  {d}: asleep until {hm(v.get('wake_at'))}: the broker holds the "
                       "deploy and it runs at its wake")
    return out


def deploy(args: argparse.Namespace, api: str, token: str) -> int:
    """`fleet deploy BUNDLE --to GROUP|all --canary N%`: upload (when BUNDLE is a file),
    start the rollout, and with --wait follow it to done or halted (exit 1 when halted)."""
    import time

    bundle = args.bundle
    if Path(bundle).is_file():
        held = _upload(api, Path(bundle), token)
        print(f"uploaded {bundle}: {held['id']} ({held['size']} bytes, sha256 "
              f"{held['sha256'][:16]}...)")
        bundle = held["id"]
    pct = float(str(args.canary).rstrip("%"))
    r = _call(api, "/api/v1/rollouts", {"bundle": bundle, "to": args.to, "canary_pct": pct},
              token=token)
    print(f"rollout {r['id']}: {r['version']} to {r['group']}, canary "
          f"{', '.join(r['canary'])}" + (f", then {len(r['rest'])} more" if r["rest"] else ""))
    for line in _away(api, token, r["canary"]):
        print(line)
    deadline, last = time.monotonic() + args.wait, ""
    lost: ApiError | None = None  # the last poll's failure while the coordinator is away
    while args.wait and time.monotonic() < deadline and r["state"] in ("canary", "rolling"):
        time.sleep(1.0)
        try:
            r = call(api, f"/api/v1/rollouts/{r['id']}", token=token, timeout=10)
        except ApiError as e:
            # A coordinator restarting (or a 5xx on its way down) does not stop the rollout:
            # it is in the coordinator's store and goes on. Exiting 1 here read as "halted".
            if e.status is not None and e.status < 500:
                raise SystemExit(f"edgerun fleet: {e.reason} (HTTP {e.status})") from None
            if lost is None:
                print(f"rollout {r['id']}: the coordinator did not answer ({e.reason}); "
                      "the rollout goes on there: following it until --wait ends",
                      file=sys.stderr, flush=True)
            lost = e
            continue
        lost = None
        if (line := _rollout_line(r)) != last:
            print(line, flush=True)
            last = line
    if lost is not None:
        print(f"rollout {r['id']}: not followed to its end: the coordinator still does not "
              f"answer ({lost.reason}); `edgerun fleet rollouts` shows it once it is back",
              file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r, indent=2))
    for d, st in sorted(r["devices"].items()):
        if st.get("reason"):
            print(f"  {d}: {st['state']}: {st['reason']}")
    return 1 if r["state"] == "halted" else 0


def add_bundles_parser(fsub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """`edgerun fleet bundles [ls]` and `edgerun fleet bundles rm ID` (runtime.cli calls
    this)."""
    fb = fsub.add_parser("bundles", help="model bundles the coordinator holds; `rm ID` "
                         "deletes one no rollout or device needs", parents=parents)
    fb.add_argument("action", nargs="?", choices=("ls", "rm"), default="ls")
    fb.add_argument("id", nargs="?", help="(rm) the bundle, NAME@VERSION")


def bundles(args: argparse.Namespace, api: str, token: str) -> int:
    """`fleet bundles [ls]`: a line per bundle; `fleet bundles rm ID`: delete it (exit 1
    when the coordinator refuses: not held, or still needed, with the reason)."""
    if args.action == "rm":
        if not args.id:
            raise SystemExit("edgerun fleet bundles rm: which bundle? (NAME@VERSION, see "
                             "`edgerun fleet bundles`)")
        done = _call(api, f"/api/v1/bundles/{urllib.parse.quote(args.id, safe='@')}",
                     token=token, method="DELETE")
        if args.json:
            print(json.dumps(done, indent=2))
        else:
            n = done["freed_bytes"]
            print(f"deleted {done['deleted']}: {done['chunks']} chunk rows, " +
                  (f"{n / 2**20:.1f} MB" if n >= 1 << 20 else f"{n / 1024:.1f} KB") +
                  " freed in the store")
        return 0
    rows = _call(api, "/api/v1/bundles", token=token)
    if args.json:
        print(json.dumps(rows, indent=2))
    for b in rows if not args.json else ():
        print(f"{b['id']:<40} {b['size']:>12} bytes  sha256 {b['sha256'][:16]}...")
    return 0


def fleet_command(args: argparse.Namespace) -> int:
    """Run one `fleet` action; prints a table or JSON. Exit 1 when a command is refused."""
    api, token_file = resolve(args)
    token = read_token(token_file)
    if args.fleet_command == "deploy":
        return deploy(args, api, token)
    if args.fleet_command == "bundles":
        return bundles(args, api, token)
    if args.fleet_command == "group":
        groups = _call(api, "/api/v1/groups", {"group": args.group, "devices": args.devices},
                       token=token)
        for g, members in sorted(groups.items()):
            print(f"{g}: {', '.join(members)}")
        return 0
    if args.fleet_command == "rollouts":
        rows = ([_call(api, f"/api/v1/rollouts/{args.id}", token=token)] if args.id
                else _call(api, "/api/v1/rollouts", token=token))
        if args.json:
            print(json.dumps(rows, indent=2))
        for r in rows if not args.json else ():
            print(_rollout_line(r))
        return 0
    if args.fleet_command == "ls":
        rows = _call(api, "/api/v1/fleet", token=token)
        print(json.dumps(rows, indent=2) if args.json else views.fleet_table(rows))
        return 0
    if args.fleet_command == "show":
        view = _call(api, f"/api/v1/devices/{args.device}", token=token)
        print(json.dumps(view, indent=2) if args.json else views.device_summary(view))
        return 0
    reply = _call(api, f"/api/v1/devices/{args.device}/commands",
                  {"cmd": args.cmd, "args": parse_args_kv(args.kv), "wait_s": args.wait},
                  timeout=args.wait + 10, token=token)
    print(json.dumps(reply, indent=2) if args.json else
          f"{reply['status']}: {reply.get('reason', '')}", file=sys.stdout)
    return 0 if reply.get("ok") else 1
