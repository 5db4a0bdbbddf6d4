"""A Sparkplug B 3.0 edge node beside the native JSON tree (docs/sparkplug.md): the session's
rules (session.py, pure), its metrics (metrics.py, pure), payloads through the Tahu schema
(payload.py) and the MQTT I/O (node.py)."""
