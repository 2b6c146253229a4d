"""PyTriton's handshake race is told apart from any other failed start
(engines.triton.pytriton.handshake_race); on the H200 the retried start is
in the scenario's summary (docs/examples/gpu-triton-h200)."""

from engines.triton.pytriton import handshake_race

BANNER = "=== ordeal: start #1 of triton-0 at 2026-12-01T10:00:00.000Z: python -m ..."
RACE = [
    "E1201 10:00:09 pb_stub.cc:402] Failed to initialize Python stub: ConnectionRefusedError: "
    "[Errno 111] Connection refused",
    "  File \"/tmp/site/pytriton/proxy/communication.py\", line 541, in "
    "get_config_from_handshake_server",
    "    sock.connect(socket_path.as_posix())",
]


def test_the_race_is_recognised_in_the_last_start():
    assert "handshake race" in handshake_race([BANNER, *RACE])


def test_another_failure_is_not_the_race():
    assert handshake_race([BANNER, "CUDA error: out of memory", "Connection refused"]) is None


def test_a_race_of_an_earlier_start_does_not_count():
    later = BANNER.replace("#1", "#2")
    assert handshake_race([BANNER, *RACE, later, "RuntimeError: CUDA driver too old"]) is None
