"""A restart's phases from a vLLM replica's log (engines.vllm.startup):
the lines below are a real replica's restart under load (CI, 2026-12-02),
behind the harness's banner. On a real replica: tests/test_real_cluster.py."""

from datetime import datetime, timezone

from engines.vllm.startup import failure_reason, startup_phases

LOG = """\
=== ordeal: start #1 of replica-1 at 2026-12-02T01:28:20.100Z: python -m vllm...
(APIServer pid=5797) INFO 12-02 01:28:28 [api_utils.py:347] version 0.32.0
(APIServer pid=5797) INFO 12-02 01:28:55 [entry.py:140] Starting vLLM server on http://x
=== ordeal: start #2 of replica-1 at 2026-12-02T01:30:31.500Z: python -m vllm...
(APIServer pid=6330) INFO 12-02 01:30:40 [api_utils.py:347]
(APIServer pid=6330) WARNING 12-02 01:30:41 [system_utils.py:255] Found ulimit of 20000
(EngineCore pid=6379) INFO 12-02 01:32:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0)
(Worker pid=7207) INFO 12-02 01:33:09 [cpu_model_runner.py:68] Starting to load model /m...
(Worker pid=7207) INFO 12-02 01:33:09 [default_loader.py:501] Loading weights took 0.03 seconds
(EngineCore pid=6379) INFO 12-02 01:33:13 [core.py:402] init engine (profile, create kv cache, \
warmup model) took 1.49 s
(APIServer pid=6330) INFO 12-02 01:33:14 [entry.py:140] Starting vLLM server on http://x
INFO:     Application startup complete.
""".splitlines()


def test_the_last_start_is_split_into_its_steps():
    ready = 1796175195.0  # 2026-12-02T01:33:15Z: /health said 200
    got = startup_phases(LOG, ready)
    assert got["start"] == 2
    assert got["phases"] == {"api_server_imports": 8.5, "engine_core_spawn": 130.0,
                             "worker_spawn": 19.0, "weights_load": 0.0, "engine_init": 4.0,
                             "api_server_listen": 1.0, "health_ok": 1.0}
    assert got["slowest"] == "engine_core_spawn" and "missing" not in got


def test_a_start_still_under_way_names_what_is_missing():
    got = startup_phases(LOG[:7])
    assert got["phases"] == {"api_server_imports": 8.5, "engine_core_spawn": 130.0}
    assert got["missing"] == ["worker_spawn", "weights_load", "engine_init", "api_server_listen"]


def test_a_log_without_a_timed_banner_says_so():
    got = startup_phases(["=== ordeal: start #1 of r: python", "(APIServer pid=1) INFO 12-02 "
                          "01:00:00 [x.py:1] hi"])
    assert "no start banner with a time" in got["error"]


def test_a_start_that_met_a_full_gpu_gives_vllm_s_line_as_its_reason():
    """A restart beside a co-tenant that holds the GPU (the line's words as
    vLLM 0.26 writes them): the reason is the engine's line without its
    prefix, from the last start only; an earlier start's failure or a start
    without such a line gives none."""
    full = ("(EngineCore_DP0 pid=812) ERROR 12-07 12:00:09 [core.py:708] ValueError: Free "
            "memory on device cuda:0 (20.1/79.2 GiB) on startup is less than desired GPU "
            "memory utilization (0.35, 27.7 GiB). Decrease GPU memory utilization or reduce "
            "GPU memory used by other processes.")
    restart = ["=== ordeal: start #2 of replica-1 at 2026-12-07T12:00:00.000Z: python -m vllm",
               "(APIServer pid=800) INFO 12-07 12:00:01 [api_utils.py:347] version 0.26.0",
               full, "(APIServer pid=800) ERROR 12-07 12:00:10 [x.py:1] RuntimeError: Engine "
               "core initialization failed. See root cause above. Failed core proc(s): {}"]
    assert failure_reason(LOG + restart) == (
        "out of memory: " + full[full.index("ValueError"):])
    assert failure_reason(restart[:1] + [full] + LOG[3:]) is None  # start #2 of LOG: clean
    assert failure_reason(LOG) is None


#: A GPU replica's restart (vLLM 0.26.0 on an H100, 2026-12-07,
#: docs/examples/gpu-vllm-h100-2026-12-07): no worker process of its own,
#: the EngineCore loads the model itself ("Loading model from scratch").
GPU_LOG = """\
=== ordeal: start #2 of replica-1 at 2026-12-07T12:58:29.580Z: /tmp/vllm-env/bin/python -m vllm
(APIServer pid=1861) INFO 12-07 12:58:45 [api_utils.py:345]        version 0.26.0
(EngineCore pid=1922) INFO 12-07 12:59:01 [core.py:116] Initializing a V1 LLM engine (v0.26.0)
(EngineCore pid=1922) INFO 12-07 12:59:02 [gpu_worker.py:378] Using V2 Model Runner
(EngineCore pid=1922) INFO 12-07 12:59:03 [model_runner.py:284] Loading model from scratch...
(EngineCore pid=1922) INFO 12-07 12:59:03 [default_loader.py:430] Loading weights took 0.01 seconds
(EngineCore pid=1922) INFO 12-07 12:59:06 [core.py:347] init engine (profile, create kv cache, \
warmup model) took 2.24 s
(APIServer pid=1861) INFO 12-07 12:59:08 [api_server.py:677] Starting vLLM server on http://x
""".splitlines()


def test_a_gpu_replica_s_restart_is_split_into_the_same_steps():
    ready = datetime(2026, 12, 7, 12, 59, 9, tzinfo=timezone.utc).timestamp()
    got = startup_phases(GPU_LOG, ready)
    assert "missing" not in got, got
    assert got["phases"] == {"api_server_imports": 15.4, "engine_core_spawn": 16.0,
                             "worker_spawn": 2.0, "weights_load": 0.0, "engine_init": 3.0,
                             "api_server_listen": 2.0, "health_ok": 1.0}
    assert got["slowest"] == "engine_core_spawn"
