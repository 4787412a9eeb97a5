"""An ASGI app served by uvicorn in a thread of the test process, on a free loopback port: the
fake servers that the stress and perplexity benchmarks talk to over HTTP."""
from __future__ import annotations

import threading
import time
from typing import Any

from kvbench.benchmarks.measure.servers import free_port
from tests.plugins.waits import HANG_S


class AppInThread:
    """`with AppInThread(app) as served:` serves `app` at served.url until the block ends."""

    def __init__(self, app: Any):
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + HANG_S  # a hang, not a speed limit
        while not self.server.started:
            assert time.monotonic() < deadline, "the server in a thread did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(10)
