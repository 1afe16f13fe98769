"""A local HTTP server for image URLs in tests (127.0.0.1, a free port, stopped on exit).

``answer(path)`` gives the body for a request path without its leading ``/`` (``None``: 404); every body is
served as ``image/png``. Stands in for a client's image host: the proxy's fetch and the engine's both read it.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def image_server(answer: Callable[[str], bytes | None]) -> Iterator[str]:
    """Serve ``answer`` on 127.0.0.1; yields the base URL (``http://127.0.0.1:<port>``)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answer(self.path.lstrip("/"))
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
