"""Workload files (--workload FILE.toml) and the plan's newer knobs: no cluster.

Seeded and timing-free: every check is on the plan, which is pure."""

import hashlib
import itertools
import json
import random
import shutil
import statistics
from pathlib import Path

import pytest

from load.client import plan_extras
from load.plan import PlannedRequest, group_prefixes, plan_requests
from load.spec import (
    ASSISTANT_PLACEHOLDER,
    Distribution,
    WorkloadSpec,
    describe_spec,
    load_dataset,
    spec_to_dict,
)
from load.workload_file import read_workload_file
from ordeal.config import ConfigError

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "workloads"


def take(spec, n=400, limit_s=None):
    return list(itertools.islice(plan_requests(spec, limit_s=limit_s), n))


def write(tmp_path, text, name="w.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# -- the default file is today's workload ------------------------------------

@pytest.mark.parametrize("base", [dict(duration_s=30.0, seed=0), dict(duration_s=12.0, seed=7),
                                  dict(duration_s=5.0, seed=3, timeout_s=20.0)])
def test_default_file_plans_exactly_todays_requests(base):
    wf = read_workload_file(EXAMPLES / "default.toml")
    spec = wf.spec(**base)
    assert spec == WorkloadSpec(**base)
    assert take(spec, 500, limit_s=60) == take(WorkloadSpec(**base), 500, limit_s=60)
    assert [r.body("m", True) for r in take(spec, 50)] == \
        [r.body("m", True) for r in take(WorkloadSpec(**base), 50)]


def test_old_constructor_and_bodies_unchanged():
    req = PlannedRequest(0, 0.0, "completions", True, "a b c", 7, 0.0, True)
    assert req.history == () and req.conversation is None and req.prefix_group is None
    assert req.body("m") == {"model": "m", "max_tokens": 7, "temperature": 0.0, "stream": True,
                             "prompt": "a b c", "stream_options": {
                                 "include_usage": True, "continuous_usage_stats": True}}
    chat = PlannedRequest(1, 0.0, "chat", False, "hi", 8, 0.7, False)
    assert chat.body("m")["messages"] == [{"role": "user", "content": "hi"}]
    assert plan_extras(req) == {}  # a plain request's invoke op is as it was


def test_long_output_example_is_long_streamed_and_keeps_canaries():
    spec = read_workload_file(EXAMPLES / "long-output.toml").spec(duration_s=60.0, seed=1)
    plan = take(spec, 300)
    plain = [r for r in plan if not r.canary]
    assert all(200 <= r.max_tokens <= 400 and r.stream for r in plain)
    assert statistics.mean(r.max_tokens for r in plain) > 250
    assert any(r.canary for r in plan) and spec.rate == 1.0
    # prompt words + answer tokens fit the tiny model's 512 even at ~6 tokens a word
    assert max(len(r.prompt.split()) for r in plain) * 6 + 18 + 400 < 512


# -- distributions ------------------------------------------------------------

@pytest.mark.parametrize("dist, mean, tol", [
    (Distribution("fixed", value=16), 16, 0),
    (Distribution("uniform", min=4, max=32), 18, 1.0),
    (Distribution("normal", mean=20, stddev=5, min=1, max=60), 20, 1.0),
    (Distribution("lognormal", mean=300, sigma=0.3, min=50, max=2000), 300, 15),
    (Distribution("lognormal", mean=300, sigma=0.3, min=200, max=400), 295, 20),
])
def test_distribution_samples_stay_in_bounds_with_the_asked_mean(dist, mean, tol):
    rng = random.Random(5)
    xs = [dist.sample(rng) for _ in range(5000)]
    lo, hi = dist.bounds()
    assert all(isinstance(x, int) and lo <= x <= (hi if hi is not None else 10**9) for x in xs)
    assert abs(statistics.mean(xs) - mean) <= tol


def test_distributions_drive_the_plan():
    spec = WorkloadSpec(prompt_tokens=Distribution("normal", mean=10, stddev=3, min=2, max=20),
                        output_tokens=Distribution("fixed", value=77), canary_every=0, seed=2)
    plan = take(spec, 300)
    assert all(2 <= len(r.prompt.split()) <= 20 and r.max_tokens == 77 for r in plan)
    assert 9 <= statistics.mean(len(r.prompt.split()) for r in plan) <= 11


def test_a_bare_number_is_a_fixed_length(tmp_path):
    wf = read_workload_file(write(tmp_path, "[output]\ntokens = 64\n"))
    assert wf.spec().output_tokens == Distribution("fixed", value=64)


# -- arrivals -----------------------------------------------------------------

def test_constant_arrival_gives_even_gaps(tmp_path):
    wf = read_workload_file(write(tmp_path, '[arrival]\nprocess = "constant"\nrate = 5.0\n'))
    spec = wf.spec(duration_s=10.0)
    assert spec.arrival == "constant" and spec.mode == "open"
    plan = list(plan_requests(spec, limit_s=10.0))
    assert len(plan) == 49
    gaps = [b.at_s - a.at_s for a, b in zip(plan, plan[1:])]
    assert all(abs(g - 0.2) < 1e-9 for g in gaps) and abs(plan[0].at_s - 0.2) < 1e-9


def test_closed_process_sets_a_closed_loop_of_users(tmp_path):
    wf = read_workload_file(write(tmp_path, '[arrival]\nprocess = "closed"\nusers = 6\n'))
    spec = wf.spec(duration_s=10.0, rate=3.0)
    assert spec.mode == "closed" and spec.concurrency == 6
    assert all(r.at_s == 0.0 for r in take(spec, 50))
    assert describe_spec(spec)["arrival"] == {"process": "closed", "users": 6}


def test_gamma_and_poisson_set_burstiness(tmp_path):
    g = read_workload_file(write(tmp_path, '[arrival]\nprocess = "gamma"\nburstiness = 0.25\n'
                                           'rate = 4\n'))
    assert (g.spec().burstiness, g.spec().rate, g.spec().mode) == (0.25, 4.0, "open")
    p = read_workload_file(write(tmp_path, '[arrival]\nprocess = "poisson"\n', "p.toml"))
    # poisson overrides a bursty base; a rate left out keeps the suite's
    assert p.spec(burstiness=0.5, rate=3.0).burstiness == 1.0
    assert p.spec(rate=3.0).rate == 3.0


def test_precedence_defaults_then_base_then_file(tmp_path):
    wf = read_workload_file(write(tmp_path, '[arrival]\nprocess = "poisson"\nrate = 2.5\n'
                                            '[client]\ntimeout_s = 90\n'))
    spec = wf.spec(duration_s=42.0, rate=9.0, seed=4, timeout_s=20.0)
    assert (spec.rate, spec.timeout_s) == (2.5, 90.0)  # the file wins
    assert (spec.duration_s, spec.seed) == (42.0, 4)  # the suite's
    assert spec.chat_share == WorkloadSpec().chat_share  # defaults


# -- conversations, prefixes, datasets ---------------------------------------

def test_multi_turn_bodies_carry_the_history():
    spec = WorkloadSpec(turns=3, chat_share=1.0, canary_every=0, seed=1)
    plan = take(spec, 9)
    for first in (0, 3, 6):
        t1, t2, t3 = plan[first:first + 3]
        assert {r.conversation for r in (t1, t2, t3)} == {first}
        assert [r.turn for r in (t1, t2, t3)] == [1, 2, 3]
        assert t1.body("m")["messages"] == [{"role": "user", "content": t1.prompt}]
        assert t3.body("m")["messages"] == [
            {"role": "user", "content": t1.prompt},
            {"role": "assistant", "content": ASSISTANT_PLACEHOLDER},
            {"role": "user", "content": t2.prompt},
            {"role": "assistant", "content": ASSISTANT_PLACEHOLDER},
            {"role": "user", "content": t3.prompt}]
        assert plan_extras(t3) == {"conversation": first, "turn": 3}


def test_canaries_interleave_with_conversations_and_completions_stay_single():
    plan = take(WorkloadSpec(turns=2, chat_share=0.5, canary_every=4, seed=3), 200)
    assert all(not r.history for r in plan if r.endpoint == "completions")
    assert all(r.body("m")["prompt"] in ("the quick brown fox jumps over",
                                         "alpha beta gamma delta", "router replica health")
               for r in plan if r.canary)
    convs: dict = {}
    for r in plan:
        if r.conversation is not None:
            convs.setdefault(r.conversation, []).append(r)
    assert convs and all([r.turn for r in rs] == [1, 2] for rs in list(convs.values())[:-1])


def test_prefix_groups_share_their_prefix():
    spec = WorkloadSpec(prefix_groups=3, prefix_tokens=8, canary_every=5, seed=6)
    prefixes = group_prefixes(spec)
    assert len(set(prefixes)) == 3 and all(len(p.split()) == 8 for p in prefixes)
    plan = take(spec, 300)
    plain = [r for r in plan if not r.canary]
    assert {r.prefix_group for r in plain} == {0, 1, 2}
    assert all(r.prompt.startswith(prefixes[r.prefix_group] + " ") for r in plain)
    assert all(r.prefix_group is None for r in plan if r.canary)
    # the drawn part keeps its length: prefix + 4..32 words
    assert all(12 <= len(r.prompt.split()) <= 40 for r in plain)


def test_prefixes_open_a_conversation_and_stay_in_its_history():
    plan = take(WorkloadSpec(prefix_groups=2, prefix_tokens=5, turns=2, chat_share=1.0,
                             canary_every=0, seed=2), 4)
    assert plan[1].history[0][1] == plan[0].prompt
    assert plan[1].prefix_group == plan[0].prefix_group is not None


def test_dataset_lines_are_used(tmp_path):
    shutil.copy(EXAMPLES / "sharegpt-sample.jsonl", tmp_path / "data.jsonl")
    wf = read_workload_file(write(tmp_path, '[dataset]\npath = "data.jsonl"\n'
                                            '[mix]\ncanary_every = 0\n'))
    spec = wf.spec(seed=0)
    ds = load_dataset(EXAMPLES / "sharegpt-sample.jsonl")
    assert spec.dataset.conversations == ds.conversations and len(ds.conversations) == 4
    firsts = {c[0][0] for c in ds.conversations}
    plan = take(spec, 100)
    assert {r.prompt for r in plan} == firsts  # every entry drawn, only first turns
    assert wf.describe()["effective"]["dataset"]["sha256"] == hashlib.sha256(
        (EXAMPLES / "sharegpt-sample.jsonl").read_bytes()).hexdigest()


def test_dataset_conversations_send_their_recorded_answers():
    spec = WorkloadSpec(dataset=str(EXAMPLES / "sharegpt-sample.jsonl"), turns=3,
                        chat_share=1.0, canary_every=0, seed=4)
    plan = take(spec, 60)
    thirds = [r for r in plan if r.turn == 3]
    assert thirds, "the three-turn conversation should come up"
    assert thirds[0].body("m")["messages"] == [
        {"role": "user", "content": "Name three primary colours."},
        {"role": "assistant", "content": "Red, yellow and blue."},
        {"role": "user", "content": "Which two make green?"},
        {"role": "assistant", "content": "Yellow and blue."},
        {"role": "user", "content": "Thanks."}]
    # a one-turn entry makes a one-turn conversation
    assert all(r.conversation is None for r in plan if r.prompt.startswith("Give me"))


def test_describe_is_json_ready_and_names_the_file(tmp_path):
    p = EXAMPLES / "long-output.toml"
    wf = read_workload_file(p)
    d = json.loads(json.dumps(wf.describe(duration_s=60.0, seed=1)))
    assert d["file"] == str(p) and d["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert d["effective"]["output"]["tokens"] == {"dist": "lognormal", "mean": 300,
                                                  "sigma": 0.3, "min": 200, "max": 400}
    assert d["effective"]["duration_s"] == 60.0 and "output_tokens" in d["set_by_file"]
    assert json.dumps(describe_spec(WorkloadSpec()))  # and the default spec


# -- bad inputs: one clear message, before anything starts --------------------

BAD = [
    ("mixx = 1\n", r"unknown key\(s\) \['mixx'\] at the top level; accepted: \['description'"),
    ("[mix]\nchat = 0.3\n", r"unknown key\(s\) \['chat'\] in \[mix\]; accepted: \['chat_share'"),
    ("mix = 3\n", r"mix must be a table"),
    ("[mix\n", r"cannot read it as TOML"),
    ('[output]\ntokens = { dist = "normal", mean = -5, stddev = 2 }\n',
     r"\[output\] tokens: normal mean -5: must be more than 0"),
    ('[prompt]\ntokens = { dist = "uniform", min = 40, max = 32 }\n',
     r"\[prompt\] tokens: uniform min 40 > max 32: need min <= max"),
    ('[output]\ntokens = { dist = "lognormal", mean = 300, sigma = 0 }\n',
     r"\[output\] tokens: lognormal sigma 0: must be more than 0"),
    ('[output]\ntokens = { dist = "lognormal", mean = 30, sigma = 0.3, min = 200 }\n',
     r"mean 30 lies outside min..max"),
    ('[output]\ntokens = { dist = "normal", mean = 30, sigma = 0.3 }\n',
     r"unknown key\(s\) \['sigma'\] for dist = 'normal'; accepted: \['dist', 'mean', 'stddev'"),
    ('[output]\ntokens = { dist = "zipf", mean = 3 }\n', r"dist 'zipf': use one of"),
    ('[output]\ntokens = { dist = "uniform", min = 4 }\n', r"uniform distribution needs \['max'\]"),
    ('[output]\ntokens = { dist = "uniform", min = 4.5, max = 9 }\n', r"min 4.5 must be a whole"),
    ('[output]\ntokens = "long"\n', r"\[output\] tokens: 'long' is neither"),
    ("[mix]\nchat_share = 1.5\n", r"\[mix\] chat_share 1.5: a share must be within 0..1"),
    ("[mix]\nstream_share = -0.1\n", r"\[mix\] stream_share -0.1: a share must be within 0..1"),
    ("[mix]\ntemperature = -1\n", r"\[mix\] temperature -1: must be 0 or more"),
    ("[mix]\ncanary_every = 2.5\n", r"\[mix\] canary_every: 2.5 is not a whole number"),
    ('[arrival]\nprocess = "poisson"\nrate = 0\n', r"\[arrival\] rate 0: must be more than 0"),
    ('[arrival]\nprocess = "poisson"\nrate = "fast"\n', r"\[arrival\] rate: 'fast' is not a num"),
    ('[arrival]\nprocess = "burst"\n', r"process 'burst': unknown arrival process; use one of"),
    ("[arrival]\nrate = 3\n", r"\[arrival\]: process is missing"),
    ('[arrival]\nprocess = "closed"\n', r"needs users"),
    ('[arrival]\nprocess = "closed"\nusers = 4\nrate = 2\n', r"rate: not used with process"),
    ('[arrival]\nprocess = "poisson"\nusers = 4\n', r"users is for process = \"closed\""),
    ('[arrival]\nprocess = "poisson"\nburstiness = 2\n', r"burstiness is for process = \"gamma\""),
    ('[arrival]\nprocess = "gamma"\nburstiness = 0\n', r"burstiness 0: must be more than 0"),
    ("[conversation]\nturns = 0\n", r"\[conversation\] turns 0: must be 1 or more"),
    ("[conversation]\nturns = 3\n[mix]\nchat_share = 0\n", r"turns 3: .*chat_share is 0"),
    ("[prefix]\ngroups = 2\n", r"\[prefix\] groups 2 and tokens 0: set both above 0"),
    ("[client]\ntimeout_s = 0\n", r"\[client\] timeout_s 0: must be more than 0"),
    ('[dataset]\npath = "nowhere.jsonl"\n', r"\[dataset\] path: dataset .*nowhere.jsonl.*no such"),
    ('description = 3\n', r"description must be a string"),
]


@pytest.mark.parametrize("text, match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_workload_files_are_refused_with_one_clear_message(tmp_path, text, match):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as err:
        read_workload_file(p)
    assert str(err.value).startswith(f"workload file {p}: ")


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"workload file .*nope.toml: no such file"):
        read_workload_file(tmp_path / "nope.toml")


@pytest.mark.parametrize("lines, match", [
    ('{"prompt": "ok"}\n{"prompt": "unterminated\n', r"line 2: not JSON"),
    ('{"prompt": "ok"}\n\n[1, 2]\n', r"line 3: a list, not an object"),
    ('{"text": "hi"}\n', r"line 1: neither 'prompt' nor a 'conversations' list"),
    ('{"conversations": [{"from": "gpt", "value": "hi"}]}\n', r"line 1: no human turn"),
    ('{"conversations": [{"from": "robot", "value": "hi"}]}\n', r"from 'robot': use 'human'"),
    ('{"conversations": [{"from": "human"}]}\n', r"conversations\[0\] is not"),
    ('{"prompt": ""}\n', r"line 1: prompt must be a non-empty string"),
    ("\n\n", r"no entries"),
])
def test_bad_datasets_name_the_first_bad_line(tmp_path, lines, match):
    (tmp_path / "d.jsonl").write_text(lines)
    p = write(tmp_path, '[dataset]\npath = "d.jsonl"\n')
    with pytest.raises(ConfigError, match=match) as err:
        read_workload_file(p)
    assert str(p) in str(err.value) and "d.jsonl" in str(err.value)


def test_dataset_and_prompt_lengths_exclude_each_other(tmp_path):
    shutil.copy(EXAMPLES / "sharegpt-sample.jsonl", tmp_path / "d.jsonl")
    p = write(tmp_path, '[dataset]\npath = "d.jsonl"\n[prompt]\ntokens = 8\n')
    with pytest.raises(ConfigError, match=r"\[prompt\] tokens and \[dataset\] path .* keep one"):
        read_workload_file(p)


def test_a_base_that_conflicts_with_the_file_is_refused_naming_the_file(tmp_path):
    wf = read_workload_file(write(tmp_path, "[conversation]\nturns = 2\n"))
    with pytest.raises(ConfigError, match=r"workload file .*w.toml: turns 2"):
        wf.spec(chat_share=0.0)


@pytest.mark.parametrize("bad, match", [
    (dict(arrival="sideways"), "arrival"),
    (dict(arrival="constant", mode="closed"), "constant"),
    (dict(turns=0), "turns"),
    (dict(prefix_groups=2), "prefix_groups"),
    (dict(prefix_groups=-1, prefix_tokens=-1), "prefix_groups"),
    (dict(prompt_tokens=(4, 8)), "prompt_tokens"),
])
def test_bad_specs_name_the_new_fields(bad, match):
    with pytest.raises(ConfigError, match=match):
        WorkloadSpec(**bad)


# -- the spec as JSON: summaries stay comparable, replays read it back -------

def test_spec_to_dict_of_todays_fields_is_asdict():
    import dataclasses

    for spec in (WorkloadSpec(), WorkloadSpec(seed=3, rate=2.0, max_tokens=(8, 16), mode="closed")):
        full = dataclasses.asdict(spec)
        assert spec_to_dict(spec) == {k: v for k, v in full.items() if k in spec_to_dict(spec)}
        assert "turns" not in spec_to_dict(spec) and "dataset" not in spec_to_dict(spec)


def test_spec_to_dict_round_trips_through_json(tmp_path):
    shutil.copy(EXAMPLES / "sharegpt-sample.jsonl", tmp_path / "d.jsonl")
    spec = WorkloadSpec(output_tokens=Distribution("lognormal", mean=300, sigma=0.3, min=200,
                                                   max=400),
                        arrival="constant", turns=2, prefix_groups=2, prefix_tokens=4,
                        dataset=str(tmp_path / "d.jsonl"), seed=5)
    d = json.loads(json.dumps(spec_to_dict(spec)))
    assert d["dataset"]["entries"] == 4 and "conversations" not in d["dataset"]
    back = WorkloadSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})
    assert back == spec and take(back, 50) == take(spec, 50)
    (tmp_path / "d.jsonl").write_text('{"prompt": "changed"}\n')
    with pytest.raises(ConfigError, match=r"sha256 .* the file changed"):
        WorkloadSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def test_a_sharegpt_json_array_is_read_as_published(tmp_path):
    """ShareGPT's files are one JSON array, not JSONL: read as they are,
    with the same entries as the same lines in JSONL; a bad entry is named
    by its index."""
    lines = (EXAMPLES / "sharegpt-sample.jsonl").read_text().splitlines()
    array = tmp_path / "sharegpt.json"
    array.write_text(json.dumps([json.loads(x) for x in lines if x.strip()], indent=1))
    assert load_dataset(array).conversations == load_dataset(
        EXAMPLES / "sharegpt-sample.jsonl").conversations
    array.write_text('[{"prompt": "a"}, {"conversations": 3}]')
    with pytest.raises(ConfigError, match=r"entry 1: neither 'prompt' nor a 'conversations'"):
        load_dataset(array)
    # Published files hold empty conversations: left out and counted.
    array.write_text('[{"conversations": []}, {"conversations": [{"from": "gpt", "value": "x"}]},'
                     ' {"prompt": "a"}]')
    ds = load_dataset(array)
    assert len(ds.conversations) == 1 and ds.describe()["skipped_without_a_human_turn"] == 2
    array.write_text("[]")
    with pytest.raises(ConfigError, match="no entry with a human turn"):
        load_dataset(array)
    array.write_text('[{"prompt": "a"},')
    with pytest.raises(ConfigError, match="is not a JSON array"):
        load_dataset(array)
