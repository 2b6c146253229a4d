import pytest

from ordeal.config import ClusterSpec, ConfigError, parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("90s", 90), ("5m", 300), ("72h", 259200), ("1.5h", 5400), ("250ms", 0.25), (7, 7),
    ("1h30m", 5400), ("2m30s", 150), ("1d12h", 129600), (" 1h 30m ", 5400), ("1m500ms", 60.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "5 parsecs", "0", "-3s", "30m1h", "1m1m", "1h30x",
                                  "0h0m"])
def test_bad_durations_name_the_setting(text):
    with pytest.raises(ConfigError, match="--load-duration"):
        parse_duration(text, "--load-duration")


@pytest.mark.parametrize("kw, match", [
    (dict(backend="moon"), "unknown backend"), (dict(replicas=0), "--replicas"),
    (dict(host="10.0.0.5"), "loopback"), (dict(engine="tgi"), "unknown engine"),
    (dict(engine="triton", backend="docker"), "--cluster local only")])
def test_bad_cluster_specs(kw, match):
    with pytest.raises(ConfigError, match=match):
        ClusterSpec(**kw)
