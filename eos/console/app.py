"""The console's Flask app: each page as HTML and as JSON, the Abort action, errors as pages.

Theory of operation
-------------------
`create_app(admin, ...)` builds the app around one eos.Admin, connected as the principal the
console was given (its --command-config), shared by the worker threads (Admin is safe to
share). Every page in `PAGES` is one function of `eos.console.views` rendered twice: at its
path as a Jinja template, and at /api/<path> as JSON, from the same dict.

Read-only unless the principal may act: the only action, aborting a hanging transaction,
is a POST that the app refuses (403) unless the broker says, at that moment, that the
principal holds ALTER or CLUSTER_ACTION on the cluster (KIP-430's authorized operations;
the broker checks again when it gets the AbortTransaction). The form carries a token made
at start, so another site cannot make a visitor's browser post it (same-origin rules keep
the token from that site); the pages also forbid framing.

The console has no login of its own: whoever reaches its port acts as its principal. It
binds to 127.0.0.1 by default; put it behind a proxy that authenticates before exposing it.

Errors: an EosError from the Admin becomes a page (or JSON) with its code and message: 404
for a topic, group or transactional id that does not exist, 403 when the principal is not
authorized, 503 when the cluster does not answer (retriable errors), 502 otherwise; a
malformed form is 400. Each response says how long the app took in a Server-Timing header
(app;dur=<ms>), which the bench reads.
"""
from __future__ import annotations

import hmac
import secrets
import time
from pathlib import Path
from typing import Callable, NamedTuple

from flask import Flask, abort, g, jsonify, redirect, render_template, request, url_for
from werkzeug.exceptions import HTTPException, SecurityError

from eos.admin_transactions import MAX_TRANSACTION_TIMEOUT_MS
from eos.console import views
from eos.console.throughput import ThroughputSampler, end_offset_sums
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition

_HERE = Path(__file__).resolve().parent
_NOT_FOUND = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.GROUP_ID_NOT_FOUND,
                        ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, ErrorCode.INVALID_TOPIC_EXCEPTION})
_SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",              # the Abort button must not be clickable through a frame
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class Page(NamedTuple):
    path: str          # Flask's rule, also served under /api
    endpoint: str
    template: str
    title: str
    view: Callable     # (app context, **path arguments) -> dict
    section: str = ""  # the navigation entry it belongs to (a topic's: Topics); "": its own


PAGES = (
    Page("/brokers", "brokers", "brokers.html", "Brokers", lambda c: views.brokers(c.admin)),
    Page("/topics", "topics", "topics.html", "Topics", lambda c: views.topics(c.admin)),
    Page("/topics/<name>", "topic", "topic.html", "Topic", lambda c, name: views.topic(c.admin, name), "topics"),
    Page("/groups", "groups", "groups.html", "Consumer groups", lambda c: views.groups(c.admin)),
    Page("/groups/<path:group_id>", "group", "group.html", "Group",
         lambda c, group_id: views.group(c.admin, group_id), "groups"),
    Page("/transactions", "transactions", "transactions.html", "Transactions",
         lambda c: views.transactions(c.admin, hanging_after_ms=c.hanging_after_ms)),
    Page("/throughput", "throughput", "throughput.html", "Throughput", lambda c: c.sampler.sample()),
)


class ConsoleContext(NamedTuple):
    """What the pages read, fixed at start."""
    admin: object
    hanging_after_ms: int
    sampler: ThroughputSampler
    abort_token: str


# The names a browser may use for the console. Anything else in a request's Host header is
# refused (400): a page that rebinds its own name to 127.0.0.1 would otherwise be
# same-origin with the console, read the abort form's token and post it.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def create_app(admin, *, hanging_after_ms: int = MAX_TRANSACTION_TIMEOUT_MS,
               sampler: ThroughputSampler | None = None, trusted_hosts=LOOPBACK_HOSTS) -> Flask:
    """The console over `admin`. `hanging_after_ms`: how long an open transaction goes
    without a write before find-hanging reports it (Kafka's default: 15 minutes).
    `trusted_hosts`: the host names (any port) requests may name; see LOOPBACK_HOSTS."""
    app = Flask("eos.console", template_folder=str(_HERE / "templates"), static_folder=str(_HERE / "static"))
    app.config["TRUSTED_HOSTS"] = list(trusted_hosts)
    context = ConsoleContext(admin, hanging_after_ms,
                             sampler or ThroughputSampler(lambda: end_offset_sums(admin)), secrets.token_urlsafe(32))
    app.extensions["eos_console"] = context
    app.jinja_env.trim_blocks = app.jinja_env.lstrip_blocks = True     # a 1,000-row table without blank lines
    app.jinja_env.filters["human_bytes"] = human_bytes
    app.jinja_env.globals["nav"] = [(p.endpoint, p.title) for p in PAGES if not p.section]
    for page in PAGES:
        _add_page(app, context, page)

    @app.get("/")
    def index():
        return redirect(url_for("brokers"))

    @app.post("/transactions/abort")
    def abort_transaction():
        form = request.form
        if not hmac.compare_digest(form.get("token", ""), context.abort_token):
            abort(400, "the form is stale or did not come from this console: reload the transactions page")
        if not views.may_abort(context.admin):
            abort(403, "the console's principal may not abort transactions (it needs ALTER or CLUSTER_ACTION "
                       "on the cluster)")
        try:
            tp = TopicPartition(form["topic"], int(form["partition"]))
            ids = [int(form[name]) for name in ("producer_id", "producer_epoch", "coordinator_epoch")]
        except (KeyError, ValueError):
            abort(400, "an abort needs topic, and integer partition, producer_id, producer_epoch and "
                       "coordinator_epoch")
        context.admin.abort_transaction(tp, *ids)
        return redirect(url_for("transactions", aborted=f"{tp.topic}-{tp.partition} (producer {ids[0]})"), 303)

    @app.before_request
    def _start_timer():
        g.started_s = time.perf_counter()

    @app.after_request
    def _headers(response):
        response.headers.update(_SECURITY_HEADERS)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - g.get('started_s', 0)) * 1000:.1f}"
        return response

    @app.errorhandler(EosError)
    def _eos_error(error: EosError):
        return _error_response(_status_of(error), error.code.name, str(error))

    @app.errorhandler(SecurityError)
    def _untrusted_host(error: SecurityError):
        # plain text: the error page's links would read the very Host header refused
        return f"400 Bad Request: {error.description}\n", 400, {"Content-Type": "text/plain; charset=utf-8"}

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException):
        return _error_response(error.code, error.name, error.description)

    return app


def _add_page(app: Flask, context: ConsoleContext, page: Page) -> None:
    def html(**arguments):
        return render_template(page.template, section=page.section or page.endpoint, title=page.title,
                               token=context.abort_token,
                               **page.view(context, **arguments))

    def api(**arguments):
        return jsonify(page.view(context, **arguments))

    app.add_url_rule(page.path, page.endpoint, html)
    app.add_url_rule("/api" + page.path, "api_" + page.endpoint, api)


def _status_of(error: EosError) -> int:
    if error.code in _NOT_FOUND:        # before retriable: an unknown topic is retriable for clients
        return 404
    if error.code.name.endswith("AUTHORIZATION_FAILED"):
        return 403
    return 503 if error.retriable else 502


def _error_response(status: int, name: str, message: str):
    if request.path.startswith("/api/"):
        return jsonify({"error": name, "message": message}), status
    return render_template("error.html", section=None, title=f"{status} {name}", status=status, name=name,
                           message=message), status


def human_bytes(size_bytes: int | None) -> str:
    """1536 -> "1.5 KiB"; None -> "unknown"."""
    if size_bytes is None:
        return "unknown"
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, index = float(size_bytes), 0
    while size >= 1024 and index < len(units) - 1:
        size /= 1024
        index += 1
    return f"{size_bytes} B" if index == 0 else f"{size:.1f} {units[index]}"
