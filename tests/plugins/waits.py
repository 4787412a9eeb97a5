"""How long a test waits for an event (a process to end, a line to be logged) before it calls it
a hang. Generous on purpose: a busy machine makes a test slow, never wrong. A speed target is a
suite's claim, measured by a benchmark, not a test's stopwatch (tests/test_test_hygiene.py)."""

HANG_S = 900.0


def healthy(url: str) -> bool:
    """Whether the server at `url` answers /health with 200 now."""
    import httpx  # the serve extra's: only servers' tests ask

    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
