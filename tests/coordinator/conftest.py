"""Fixtures the coordinator tests share."""

from __future__ import annotations

import pytest
from support.bundle_api import TOKEN


@pytest.fixture
def coord(tmp_path, store_url):
    """A coordinator on `store_url` with its API; chunk rows of 4 KiB (several a bundle)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="f", store=store_url, max_bundle_mb=8,
                                      bundles_dir=str(tmp_path / "none")))
    c.shelf.chunk_bytes = 4096
    server = serve(c, "127.0.0.1", 0, token=TOKEN)
    yield c, server.server_address[1]
    server.shutdown()
    c.store.close()
    c.shelf.close()
