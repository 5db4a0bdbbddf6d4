"""What the tests share, in one place (tests import these, never each other):

- `under_test`: which edgerun a run exercises (checkout or installed wheel) and the
  environment for subprocesses that import it;
- `waiting`: polling a condition with a deadline;
- `modelgen`, `ultralytics_export`: small ONNX models made on the spot;
- `model_dirs`: prepared model directories (manifest + variants) and bundles;
- `tiny_ort`: a tiny classifier's ONNX Runtime variant (and loaded session), fast;
- `daemon_harness`, `ota_harness`: `edgerun serve` as a child process, a fleet for OTA;
- `daemon_toml`: the daemon's config text, shared sections plus each caller's layers (the
  harness's and the benches' configs);
- `fleet`: a coordinator in-process or as a child, a publishing device process
  (`device_proc`), a webhook receiver;
- `mqtt_probe`: a raw MQTT client for ACL checks;
- `web`: small HTTP helpers for the local and coordinator APIs;
- `hang_backend`: a backend plugin that hangs, for the watchdog;
- `webdriver`, `wheel_build`: the browser and the wheel under test.

No module here may share a name with the standard library or a project package (`http`,
`models`...): device_proc.py runs as a script, with this folder first on sys.path.
"""
