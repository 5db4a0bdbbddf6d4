"""`edgerun coordinator` as a real process whose API token file cannot be used: not text (a
traceback: UnicodeDecodeError), a directory (said to be "mode 755", and `chmod 600` would not
have fixed it), under a file where its directory belongs ("[Errno 17] File exists" naming the
file, not saying it is in a directory's place). Each is one line naming
coordinator.api_token_file, the file and why; exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon_toml import coordinator_toml
from support.under_test import child_env


def _damage(tmp_path: Path, case: str) -> tuple[Path, str]:
    token = tmp_path / "tokens" / "api-token"
    if case == "not-text":
        token.parent.mkdir()
        token.write_bytes(b"\xff\xfe" + b"\x00\x9c" * 24)
        token.chmod(0o600)
        return token, "is not text"
    if case == "directory":
        token.mkdir(parents=True)
        return token, "is a directory, not a file"
    token.parent.write_text("a file where the token's directory belongs\n")
    return token, f"its directory {token.parent} is not a directory"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["not-text", "directory", "file-for-directory"])
def test_an_unusable_token_file_is_one_line_and_exit_2(tmp_path, broker, case):
    token, says = _damage(tmp_path, case)
    cfg = tmp_path / "coord.toml"
    cfg.write_text(coordinator_toml(broker.coordinator("t"), fleet="t",
                                    store=tmp_path / "coord.db", http_port=0,
                                    api_token_file=token))
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "coordinator", "--config",
                        str(cfg)], capture_output=True, text=True, timeout=90, env=child_env())
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out[-3000:]
    assert lines[0].startswith(f"edgerun: coordinator.api_token_file: {token}: "), lines[0]
    assert says in lines[0], lines[0]
