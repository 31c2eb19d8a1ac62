"""`edgeocr serve`: the local OCR daemon.

    config.py    settings (flags, EDGEOCR_* variables, config file)
    errors.py    the JSON error shape
    jobs.py      jobs and admission (the bounded queue)
    engine.py    the engine thread over edgeocr.slots.SlotScheduler (N requests at once on an N-slot artifact)
    parsing.py   request bodies -> validated OCR parameters
    app.py       the HTTP application (ASGI)
    protocol.py  connection limits on uvicorn's h11 protocol
    metrics.py   Prometheus metrics
    daemon.py    sockets, signals, drain, systemd notify
    client.py    a stdlib client for --remote and doctor

The HTTP stack (uvicorn, prometheus_client) is the `serve` extra and is imported only by `serve()`.
"""

from edgeocr.serve.client import client_request  # noqa: F401


def serve(cfg) -> int:
    """Run the daemon until SIGTERM/SIGINT/SIGHUP; returns the exit code."""
    from edgeocr.errors import EdgeOCRError

    try:
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise EdgeOCRError(f"the daemon needs {e.name}: pip install 'edgeocr[serve]'") from None
    from edgeocr.serve.daemon import run

    return run(cfg)
