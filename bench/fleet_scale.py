"""Fleet scale: simulated fleets into 1 and 2 coordinators, SQLite vs PostgreSQL, in one run.

Scenarios (runtime/tools/fleetsim.py drives the devices from this process, one local Mosquitto):
  1k   1,000 devices, health every 1 s and a result every 1 s each   (2,000 messages/s)
  10k  10,000 devices, health every 10 s and a result every 10 s each (2,000 messages/s)
each into 1 then 2 `edgerun coordinator` processes (2 = one MQTT 5 shared subscription group),
on SQLite (one WAL file; 2 coordinators share it on this machine) and on PostgreSQL (a
throw-away cluster, fsync on, synchronous_commit off: the durability of SQLite's
synchronous=NORMAL in WAL mode, i.e. a power cut may lose the last commits, a crash may not).

Per run: results appended by the devices vs stored (COUNT(*) of the rows, so a duplicate would
show) once every outbox has drained; health age p50/p99 (device `t` to committed and in the
fleet view, the worst coordinator's) over the whole run, and over the last 10 s of the
measured window (`health_age_recent_s`: without the start-up backlog of 10,000 births);
coordinator CPU (user+system of the coordinator processes) per 1,000 messages taken;
database server CPU per 1,000 (PostgreSQL only: SQLite runs inside the coordinator); store
bytes per million results (results with their keys and indexes; the whole store incl. health
in brackets). Then a per-message cost profile in this process: JSON decoding, schema
validation (compiled, and jsonschema's interpreter for reference), and the store's SQL per
message on each backend.

With `--runs N` every configuration runs N times and the summary table gives each figure as
median [min-max] over the runs (the machine's load moves them; judge a change by the spread).

Usage: python bench/fleet_scale.py [--seconds 20] [--only 10k] [--backends sqlite,postgresql]
       [--coordinators 1,2] [--runs 3] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from runtime.coordinator.pgserver import TempPostgres
from runtime.coordinator.store import Store
from runtime.tools.fleetsim import FleetSim
from runtime.wire.broker import Mosquitto, free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = {"1k": (1000, 1.0, 1.0), "10k": (10000, 10.0, 10.0)}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu_s(parent: int) -> float:
    """CPU seconds of a process and its direct children (the PostgreSQL postmaster)."""
    total = cpu_s(parent)
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    total += cpu_s(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return total


class Coord:
    """One coordinator process."""

    def __init__(self, tmp: Path, name: str, port: int, store: str, shared: bool):
        self.http = free_port()
        self.token = tmp / f"{name}.token"
        conf = tmp / f"{name}.toml"
        conf.write_text(
            f'[coordinator]\nfleet = "bench"\nstore = "{store}"\nclient_id = "{name}"\n'
            f'http_port = {self.http}\napi_token_file = "{self.token}"\n'
            + ('share_group = "bench"\n' if shared else "")
            + f'retention_interval_s = 3600\n[coordinator.broker]\nhost = "127.0.0.1"\n'
            f"port = {port}\n")
        logs = os.environ.get("EDGERUN_BENCH_LOGS")  # a directory to keep the logs in
        out = open(Path(logs) / f"{name}.log", "w") if logs else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator",
                                      "--config", str(conf)], cwd=ROOT,
                                     stdout=out, stderr=out)
        wait_port(self.http, 60)

    def stats(self) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/api/v1/stats", headers={
            "Authorization": "Bearer " + self.token.read_text().strip()})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _taken(stats: dict) -> int:
    c = stats["counters"]
    return sum(c.get(k, 0) for k in ("result", "health", "state", "event"))


def sizes(store: Store) -> tuple[int, int]:
    """(bytes of results incl. keys and indexes, bytes of the whole store)."""
    if store.backend == "sqlite":
        with store._d.reader() as db:
            res = db.execute("SELECT COALESCE(SUM(pgsize), 0) FROM dbstat WHERE name IN "
                             "('results', 'result_counts')").fetchone()[0]
        return int(res), store.used_bytes()
    with store._d.reader() as db:
        res = db.execute("SELECT COALESCE(SUM(pg_total_relation_size(relid)), 0) FROM "
                         "pg_partition_tree('results')").fetchone()[0]
        res += db.execute("SELECT pg_total_relation_size('result_keys')").fetchone()[0]
    return int(res), store.used_bytes()


def run(tmp: Path, broker: Mosquitto, backend: str, pg: TempPostgres | None, scenario: str,
        ncoord: int, seconds: float, k: int = 0) -> dict:
    """One run (the k-th of its configuration); returns its row."""
    devices, health_s, result_s = SCENARIOS[scenario]
    name = f"{scenario}-{backend}-{ncoord}-r{k}"
    url = (pg.create_database(name.replace("-", "_")) if backend == "postgresql"
           else str(tmp / f"{name}.db"))
    load0 = os.getloadavg()[0]
    coords = [Coord(tmp, f"{name}-c{k}", broker.port, url, ncoord > 1) for k in range(ncoord)]
    pg_pid = int((pg.dir / "data" / "postmaster.pid").read_text().split()[0]) if (
        backend == "postgresql") else None
    sim = FleetSim("127.0.0.1", broker.port, devices, "bench", health_s, result_s,
                   connections=8, ack_timeout_s=10.0, prefix=f"{scenario}{backend[0]}{ncoord}r{k}-")
    try:
        sim.start(60)
        time.sleep(min(5.0, seconds / 4))  # births and the first wave settle
        st0 = [c.stats() for c in coords]
        cpu0 = [cpu_s(c.proc.pid) for c in coords]
        db0 = children_cpu_s(pg_pid) if pg_pid else 0.0
        time.sleep(seconds)
        st1 = [c.stats() for c in coords]
        cpu1 = [cpu_s(c.proc.pid) for c in coords]
        db1 = children_cpu_s(pg_pid) if pg_pid else 0.0
        sim.stop_appending()
        drained = sim.wait_drained(120)
        time.sleep(1.0)
        st2 = [c.stats() for c in coords]
    finally:
        sim.stop()
        for c in coords:
            c.stop()
    store = Store(url)
    try:
        with store._d.reader() as db:
            rows = db.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        res_bytes, all_bytes = sizes(store)
    finally:
        store.close()
    taken = sum(_taken(b) - _taken(a) for a, b in zip(st0, st1, strict=True))
    ages = [s["health_age_s"] for s in st2 if s["health_age_s"]["n"]]
    row = {
        "scenario": scenario, "backend": backend, "coordinators": ncoord, "run": k,
        "appended": sim.stats.results_appended, "stored": rows, "drained": drained,
        "exactly_once": drained and rows == sim.stats.results_appended,
        "msgs_per_s": taken / seconds,
        "age_p50": max((a["p50"] for a in ages), default=float("nan")),
        "age_p99": max((a["p99"] for a in ages), default=float("nan")),
        # the last 10 s of the measured window only (no start-up backlog): steady state
        "steady_p50": max((s["health_age_recent_s"]["p50"] for s in st1
                           if s.get("health_age_recent_s", {}).get("n")), default=float("nan")),
        "steady_p99": max((s["health_age_recent_s"]["p99"] for s in st1
                           if s.get("health_age_recent_s", {}).get("n")), default=float("nan")),
        "health_taken": sum(s["counters"].get("health", 0) for s in st2),
        "coord_cpu_per_1k": sum(b - a for a, b in zip(cpu0, cpu1, strict=True))
        / max(1, taken) * 1000,
        "db_cpu_per_1k": (db1 - db0) / max(1, taken) * 1000 if pg_pid else None,
        "bytes_per_m_results": res_bytes / max(1, rows) * 1e6,
        "store_bytes_per_m_results": all_bytes / max(1, rows) * 1e6,
        # messages waiting in the coordinators' inboxes at the end of the window: near 0 =
        # the coordinators keep up, and any lag is before them (broker, devices)
        "inbox_end": sum(s["inbox"] for s in st1),
        "inbox_full_dropped": sum(s["counters"].get("inbox_full_dropped", 0) for s in st2),
        "resent": sim.stats.resent, "load": (load0, os.getloadavg()[0]),
    }
    verdict = ("exactly once" if row["exactly_once"] else
               f"NOT drained: {sim.unacked()} unacked after 120 s" if not drained else
               "NOT EXACTLY ONCE")
    print(f"  {scenario:>3} {backend:<10} x{ncoord}: stored {rows}/{row['appended']} "
          f"({verdict}), "
          f"{row['msgs_per_s']:.0f} msg/s, health age p50 {row['age_p50']:.2f} s "
          f"p99 {row['age_p99']:.2f} s (last 10 s of the window: p50 {row['steady_p50']:.2f} "
          f"p99 {row['steady_p99']:.2f} s), coordinator CPU {row['coord_cpu_per_1k']:.3f} s/1k msg"
          + (f", db CPU {row['db_cpu_per_1k']:.3f} s/1k" if pg_pid else "")
          + f", inbox {row['inbox_end']}"
          + f", {row['bytes_per_m_results'] / 2**20:.0f} MB/M results "
          f"({row['store_bytes_per_m_results'] / 2**20:.0f} MB/M with health), "
          f"re-sent {row['resent']}, load {row['load'][0]:.1f}->{row['load'][1]:.1f}",
          flush=True)
    return row


def profile(pg: TempPostgres | None, backends: list[str], tmp: Path, n: int = 4000) -> dict:
    """Where a coordinator's CPU goes, per message, measured stage by stage in this process
    (CPU time, no profiler: cProfile inflates jsonschema's deep call tree several-fold):
    JSON decoding and schema validation of each kind, then per backend the store alone
    (Store.ingest of decoded messages) and the whole ingest path (Coordinator._ingest: admit,
    store, in-memory view, ack encoding) on n raw messages, half health, half one-result
    batches of 1,000 devices, in batches of 500."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.coordinator.store import Inbound
    from runtime.wire import payloads, safejson

    raws = []
    for i in range(n // 2):
        dev, seq = f"p{i % 1000:04d}", i // 1000 + 1
        raws.append((f"edgerun/v1/bench/{dev}/health", json.dumps(
            {"v": 1, "t": time.time(), "boot": "b", "temp_c": 50.0, "rung": 0,
             "choice": "sim"}).encode(), time.time()))
        raws.append((f"edgerun/v1/bench/{dev}/result", json.dumps(
            {"v": 1, "stream": "s", "boot": "b", "floor": seq, "results": [
                {"seq": seq, "t": time.time(), "label": "ok", "score": 0.9,
                 "latency_ms": 3.2}]}).encode(), time.time()))
    out: dict[str, float] = {}
    for kind, k in (("health", 0), ("result", 1)):
        t0 = time.process_time()
        objs = [safejson.loads(raws[k][1]) for _ in range(500)]
        out[f"JSON {kind}"] = (time.process_time() - t0) / 500 * 1e6
        payloads.check(kind, objs[0])  # compiled on first use: not part of the per-message cost
        t0 = time.process_time()
        for o in objs:
            payloads.check(kind, o)
        out[f"schema {kind}"] = (time.process_time() - t0) / 500 * 1e6
        t0 = time.process_time()  # the interpreter, which now only explains refusals
        for o in objs:
            list(payloads.interpreter(kind).iter_errors(o))
        out[f"jsonschema {kind}"] = (time.process_time() - t0) / 500 * 1e6
    inbound = [Inbound(t.split("/")[3], t.rsplit("/", 1)[1], json.loads(r)) for t, r, _ in raws]
    for backend in backends:
        for stage in ("store", "ingest"):
            url = (pg.create_database(f"profile_{stage}") if backend == "postgresql"
                   else str(tmp / f"p-{stage}.db"))
            coord = Coordinator(CoordinatorConfig(fleet="bench", store=url))
            t0 = time.process_time()
            for i in range(0, n, 500):
                if stage == "store":
                    coord.store.ingest(inbound[i:i + 500])
                else:
                    coord._ingest(raws[i:i + 500])
            out[f"{stage} {backend}"] = (time.process_time() - t0) / n * 1e6
            coord.store.close()
    print("  coordinator CPU per message, by stage: " + ", ".join(
        f"{k} {v:.0f} µs" for k, v in out.items()), flush=True)
    return out


def _spread(values: list[float], fmt: str) -> str:
    """One value, or median [min-max] of several."""
    vals = sorted(v for v in values if v is not None and v == v)
    if not vals:
        return "-"
    if len(vals) == 1:
        return format(vals[0], fmt)
    med = vals[len(vals) // 2] if len(vals) % 2 else (vals[len(vals) // 2 - 1]
                                                       + vals[len(vals) // 2]) / 2
    return f"{format(med, fmt)} [{format(vals[0], fmt)}-{format(vals[-1], fmt)}]"


def summary(rows: list[dict]) -> str:
    """The runs side by side (SQLite vs PostgreSQL, 1 vs 2 coordinators), a markdown table;
    each figure median [min-max] over the runs of its configuration."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["scenario"], r["coordinators"], r["backend"]), []).append(r)
    out = ["| fleet | store | coord. | runs stored exactly once | stored / appended | "
           "taken msg/s | health age p50 s | p99 s | last 10 s: p50 | p99 | "
           "coordinator CPU s per 1k msg | "
           "DB CPU s per 1k | results MB per M (with health) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (scenario, ncoord, backend), rs in groups.items():
        out.append(
            f"| {scenario} | {backend} | {ncoord} | "
            f"{sum(r['exactly_once'] for r in rs)}/{len(rs)} | "
            + ", ".join(f"{r['stored']:,}/{r['appended']:,}" for r in rs) + " | "
            f"{_spread([r['msgs_per_s'] for r in rs], '.0f')} | "
            f"{_spread([r['age_p50'] for r in rs], '.2f')} | "
            f"{_spread([r['age_p99'] for r in rs], '.2f')} | "
            f"{_spread([r['steady_p50'] for r in rs], '.2f')} | "
            f"{_spread([r['steady_p99'] for r in rs], '.2f')} | "
            f"{_spread([r['coord_cpu_per_1k'] for r in rs], '.3f')} | "
            f"{_spread([r['db_cpu_per_1k'] for r in rs], '.3f')} | "
            f"{_spread([r['bytes_per_m_results'] / 2**20 for r in rs], '.0f')} "
            f"({_spread([r['store_bytes_per_m_results'] / 2**20 for r in rs], '.0f')}) |")
    return "\n".join(out)


def main() -> None:
    """Run the scenarios (see the module docstring) and print one line each."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--only", choices=sorted(SCENARIOS), action="append")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--coordinators", default="1,2")
    ap.add_argument("--runs", type=int, default=1, help="runs of each configuration")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-stage profile")
    ap.add_argument("--json", default="", help="write the rows here")
    a = ap.parse_args()
    backends = a.backends.split(",")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        pg = (TempPostgres({"fsync": "on", "synchronous_commit": "off",
                            "full_page_writes": "on"}).start()
              if "postgresql" in backends else None)
        rows = []
        try:
            print(f"fleet scale: {a.seconds:.0f} s per run, {os.cpu_count()} cores, load "
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            for scenario in a.only or ["1k", "10k"]:
                for ncoord in (int(x) for x in a.coordinators.split(",")):
                    for backend in backends:
                        for k in range(a.runs):
                            # a broker per run: the stopped coordinators' persistent sessions
                            # (and their unbounded queues) must not load the next run's broker
                            where = tmp / f"broker-{scenario}-{ncoord}-{backend}-{k}"
                            where.mkdir()
                            broker = Mosquitto(where, extra="max_queued_messages 0",
                                               auth=False).start()
                            try:
                                rows.append(run(tmp, broker, backend, pg, scenario, ncoord,
                                                a.seconds, k))
                            finally:
                                broker.stop()
            print(summary(rows), flush=True)
            prof = {} if a.no_profile else profile(pg, backends, tmp)
        finally:
            if pg:
                pg.stop()
        if a.json:
            Path(a.json).write_text(json.dumps({"runs": rows, "profile": prof}, indent=1))


if __name__ == "__main__":
    main()
