"""The console's HTTP server: waitress serving the Flask app, in the foreground or on a thread.

Theory of operation
-------------------
waitress runs an asyncore loop that accepts connections and parses requests, and hands each
request to one of `threads` worker threads, which run the Flask app (and so the Admin's
blocking RPCs). `ConsoleServer` binds at construction, so `port=0` picks a free port that
`.port` tells at once (tests and the bench use that). `serve_forever()` runs the loop on the
calling thread (the CLI; Ctrl-C ends it). `start()` runs it on a daemon thread and `stop()`
ends it from any thread: the closing of every socket is handed to the loop's own thread
through waitress's trigger (closing them from another thread would race the loop's poll),
the loop ends once its map is empty, then the worker threads are shut down.
"""
from __future__ import annotations

import threading

from waitress import create_server
from waitress import wasyncore

THREADS_DEFAULT = 8             # pages wait on broker RPCs, not on the CPU
STOP_TIMEOUT_S = 10.0


class ConsoleServer:
    def __init__(self, app, *, host: str = "127.0.0.1", port: int = 8080, threads: int = THREADS_DEFAULT):
        self._server = create_server(app, host=host, port=port, threads=threads,
                                     ident="eos-console", clear_untrusted_proxy_headers=True)
        self.host = host
        self.port = self._server.effective_port
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serve_forever(self) -> None:
        """Serve on this thread until Ctrl-C (waitress closes its sockets then)."""
        self._server.run()

    def start(self) -> ConsoleServer:
        self._thread = threading.Thread(target=self._server.run, name="eos-console", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        server = self._server
        server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
        server.task_dispatcher.shutdown(timeout=STOP_TIMEOUT_S)

    def __enter__(self) -> ConsoleServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
