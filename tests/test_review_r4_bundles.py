"""Review R4 of bundle delete / sweep (H26): findings, each a test that failed before its fix."""

from __future__ import annotations

from test_bundle_delete import TOKEN, _req, coord, small_bundle  # noqa: F401 (fixture)


def test_cli_rm_of_a_version_with_plus(tmp_path, coord, capsys):  # noqa: F811
    """Old code: `edgerun fleet bundles rm m@1.0+b2` sent `m@1.0%2Bb2` (quoted) and the
    server, which never unquoted the path, answered 404 "not a bundle id": a bundle whose
    version has a `+` (allowed by runtime.bundle.VERSION) could not be deleted by the CLI."""
    from runtime.cli import main

    c, port = coord
    assert _req(port, "PUT", "/api/v1/bundles", small_bundle(tmp_path, "m", "1.0+b2"))[0] == 200
    assert c.shelf.get("m@1.0+b2") is not None
    (tmp_path / "tok").write_text(TOKEN + "\n")
    conf = ["fleet", "--api", f"http://127.0.0.1:{port}", "--token-file", str(tmp_path / "tok")]
    assert main([*conf, "bundles", "rm", "m@1.0+b2"]) == 0
    assert "deleted m@1.0+b2" in capsys.readouterr().out
    assert c.shelf.get("m@1.0+b2") is None
    # a path character, encoded or not, is still no bundle id
    assert _req(port, "DELETE", "/api/v1/bundles/m%2F..@1")[0] == 404
