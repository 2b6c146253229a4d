import sys

import pytest


@pytest.fixture(autouse=True)
def isolated_state(tmp_path, monkeypatch):
    """Each test gets its own ledger and process records, so tests never
    reap or heal each other's (or a real run's) state."""
    monkeypatch.setenv("ORDEAL_STATE_DIR", str(tmp_path / "state"))


PY = sys.executable
# A real HTTP server process answering /health after a delay, in its own
# process group with a child of its own (like vLLM's API server + EngineCore).
HEALTH_SERVER = r"""
import http.server, os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print("CHILDPID=%d" % child.pid, flush=True)
time.sleep(float(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.fixture
def health_server_argv():
    def argv(port: int, delay: float = 0.0) -> list[str]:
        return [PY, "-c", HEALTH_SERVER, str(port), str(delay)]
    return argv


def pids_alive(pids):
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


def pytest_collection_modifyitems(items):
    """No test of the suite's own may hang CI: each gets a 10-minute cap
    (pytest-timeout), unless it sets its own."""
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(600))
