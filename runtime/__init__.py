"""edgerun runtime: backends, profiler, selector, CLI."""

import os as _os

# ONNX Runtime's official builds (1.32 here) start their own telemetry at import: a device
# id file and an event cache under ~/.cache/Microsoft/DeveloperTools/.onnxruntime, written
# while the daemon runs, and an uploader. An appliance on a customer's network neither phones
# home unasked nor wears its card for it. ORT reads this once, when it initialises, so it is
# set here, before any module of edgerun can import onnxruntime; an operator's own value
# (ORT_DISABLE_TELEMETRY=0) is kept. docs/telemetry.md, "Disk writes".
_os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
