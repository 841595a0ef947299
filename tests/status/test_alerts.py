"""``launcher alerts``: the shipped Prometheus rules and Grafana dashboard, checked with a real ``promtool``
(Debian's ``prometheus`` package; the promtool tests are skipped where it is missing).

``promtool test rules`` runs on series recorded from real jobs: each test scrapes a running job's
``/metrics`` at chosen moments (waiting for the state it records, never for a time), and the
samples become promtool's ``input_series``, one scrape per minute of promtool's clock, the last
one repeated so that every ``for:`` elapses. Alerts whose conditions last minutes or hours in a
real job (a straggler for 5 minutes, no heartbeat for 10, no workers for 10, a hung rank, which
the agent ends within a publish interval) are tested on hand-written series instead, in
:func:`test_alerts_that_take_minutes_fire_on_hand_written_series`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from launcher.status.metrics import render as metrics

from tests.background_job import BackgroundJob
from tests.conftest import LAUNCHER, launcher_env
from tests.status.jobs import wait_for
from tests.status.test_render import record

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "core" / "launcher" / "status" / "prometheus"
#: Scrapes are one minute apart on promtool's clock; the last is repeated this many times more.
HOLD = 12

# Ranks note their pid once up, heartbeat until the go file appears. Rank 1 of the attempts
# below FAIL_ATTEMPTS exits 3 (the first such attempt waits for the trigger file first); with
# HANG, rank 1 of attempt 0 stops heartbeating once the trigger file appears.
WORKER = """
import os, sys, time
import launcher

ready, go, trigger = sys.argv[1], sys.argv[2], sys.argv[3]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = os.environ["RANK"]
failing = rank == "1" and attempt < int(os.environ.get("FAIL_ATTEMPTS", "0"))
hanging = rank == "1" and attempt == 0 and os.environ.get("HANG")
with open(f"{ready}.{attempt}.{rank}", "w") as handle:
    handle.write(str(os.getpid()))
end = time.monotonic() + 90
step = 0
while not os.path.exists(go) and time.monotonic() < end:
    if os.path.exists(trigger) and failing:
        sys.exit(3)
    if os.path.exists(trigger) and hanging:
        while not os.path.exists(go) and time.monotonic() < end:
            time.sleep(0.05)  # no heartbeat any more
        break
    step += 1
    launcher.heartbeat(step)
    time.sleep(0.05)
"""


@pytest.fixture(scope="session")
def promtool() -> str:
    """``promtool``'s path; the test is skipped where it is missing."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip("promtool is missing (Debian: apt-get install prometheus)")
    return binary


def printed(what: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAUNCHER, "alerts", what], env=launcher_env(), capture_output=True, text=True,
                          timeout=60)


def rule_list() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load((SHIPPED / "rules.yml").read_text())["groups"] for rule in group["rules"]]


ALERTS = [rule["alert"] for rule in rule_list()]


def test_the_command_prints_the_shipped_files_and_refuses_bad_arguments():
    rules, dashboard = printed("rules"), printed("dashboard")
    assert rules.returncode == 0 and rules.stdout == (SHIPPED / "rules.yml").read_text(), rules
    assert dashboard.returncode == 0 and dashboard.stdout == (SHIPPED / "dashboard.json").read_text(), dashboard
    assert yaml.safe_load(rules.stdout)["groups"][0]["name"] == "launcher"
    assert json.loads(dashboard.stdout)["uid"] == "launcher-jobs"
    for args, words in [([], "an argument is needed"), (["rulez"], "unknown argument 'rulez'"),
                        (["rules", "--json"], "unknown argument '--json'"), (["--dashboard"], "unknown argument")]:
        result = subprocess.run([*LAUNCHER, "alerts", *args], env=launcher_env(), capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2 and result.stdout == "", (args, result)
        assert len(result.stderr.splitlines()) == 1 and "Traceback" not in result.stderr, (args, result)
        assert words in result.stderr and "usage: launcher alerts rules|dashboard" in result.stderr, (args, result)


def test_the_command_imports_neither_torch_nor_the_agent():
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "launcher", "alerts", "rules"],
                            env=launcher_env(), capture_output=True, text=True, timeout=60)
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert result.returncode == 0 and "launcher.status.alerts" in imported, result.stderr[-2000:]
    assert not {name for name in imported if name.split(".")[0] == "torch" or name.startswith("launcher.agent")}


def test_every_metric_the_rules_and_the_dashboard_use_is_one_launcher_exports():
    # Every family the exporter can write: a record with every optional part present.
    full = record(straggler_detection=True, slow_ranks=[1], spares_waiting=0, kept_out=[],
                  ranks=[{**record()["ranks"][0], "steps_per_s": 1.0, "gpu_util_percent": 5.0,
                          "gpu_memory_bytes": 1.0}])
    exported = set(re.findall(r"^# TYPE (\S+) ", metrics(full, hangs_seen=0), re.M))
    assert len(exported) == 21, exported
    used = set(re.findall(r"launcher_[a-z_]+", "\n".join(rule["expr"] for rule in rule_list())))
    dashboard = json.loads((SHIPPED / "dashboard.json").read_text())
    used_there = {name for panel in dashboard["panels"] for target in panel["targets"]
                  for name in re.findall(r"launcher_[a-z_]+", target["expr"])}
    assert used and used <= exported, used - exported
    assert used_there and used_there <= exported, used_there - exported
    for rule in rule_list():  # a severity, and text that names the job
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule
        assert "$labels.job" in rule["annotations"]["summary"], rule
        assert rule["annotations"]["description"], rule


def test_promtool_checks_the_printed_rules(promtool, tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(printed("rules").stdout)
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and f"SUCCESS: {len(ALERTS)} rules found" in result.stdout, result


# -- promtool test rules ---------------------------------------------------------------------


def _render(template: str, labels: dict[str, str], value: float) -> str:
    """The Go templates the rules' annotations use, rendered as Prometheus renders them (the few
    forms the shipped rules use; another one fails here rather than pass unchecked)."""
    def one(match: re.Match[str]) -> str:
        body = match.group(1).strip()
        if body.startswith("$labels."):
            return labels.get(body[len("$labels."):], "")
        if body == "$value":
            return f"{value:g}"
        if body == '$value | printf "%.0f"':
            return f"{value:.0f}"
        if body == "$value | humanizeDuration" and 60 <= value < 3600:
            return f"{int(value) // 60}m {value % 60:g}s"
        raise AssertionError(f"the test does not render {{{{ {body} }}}}")
    return re.sub(r"\{\{(.*?)\}\}", one, template)


def expected(alert: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    """An ``exp_alerts`` entry of ``alert`` with ``labels`` (its own severity added) and ``value``."""
    rule = next(rule for rule in rule_list() if rule["alert"] == alert)
    return {"exp_labels": {**labels, "severity": rule["labels"]["severity"]},
            "exp_annotations": {key: _render(text, labels, value) for key, text in rule["annotations"].items()}}


def promtool_test(promtool: str, tmp_path: Path, series: dict[str, list[float | str | None]],
                  checks: list[tuple[int, dict[str, list[dict[str, Any]]]]]) -> None:
    """``promtool test rules`` of the printed rules on ``series`` (one value a minute; ``None``: no
    sample; ``"stale"``: the series ended, as a target that went away): at each ``(minute, firing)``
    of ``checks`` exactly the alerts of ``firing`` fire, every other none."""
    rules = tmp_path / "rules.yml"
    rules.write_text(printed("rules").stdout)
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": name, "values": " ".join(
                "_" if v is None else v if isinstance(v, str) else f"{v:g}" for v in values)}
                for name, values in series.items()],
            "alert_rule_test": [{"eval_time": f"{at}m", "alertname": alert, "exp_alerts": firing.get(alert, [])}
                                for at, firing in checks for alert in ALERTS],
        }],
    }
    path = tmp_path / "test.yml"
    path.write_text(json.dumps(test, indent=1))  # JSON is YAML
    result = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{json.dumps(test, indent=1)[:6000]}"


def scrape(port: int) -> dict[str, float]:
    """``series -> value`` of one scrape of ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def recorded(scrapes: list[dict[str, float]]) -> dict[str, list[float | str | None]]:
    """The scrapes as promtool's series: one value a minute, the last scrape held :data:`HOLD` minutes."""
    held = scrapes + [scrapes[-1]] * HOLD
    names = sorted({name for one in scrapes for name in one})
    return {name: [one.get(name) for one in held] for name in names}


def value(samples: dict[str, float], metric: str) -> float | None:
    found = [v for name, v in samples.items() if name.split("{")[0] == metric]
    return found[0] if len(found) == 1 else None


def node_labels(samples: dict[str, float]) -> dict[str, str]:
    """The ``job`` and ``node`` labels of the scraped node (``--standalone`` makes its own run id)."""
    found = re.search(r'\{job="([^"]+)",node="([^"]+)"', next(iter(samples)))
    assert found is not None, samples
    return {"job": found.group(1), "node": found.group(2)}


def ranks_up(samples: dict[str, float]) -> bool:
    return sorted(v for name, v in samples.items() if name.startswith("launcher_rank_up{")) == [1.0, 1.0]


def ranks_beating(samples: dict[str, float]) -> bool:
    """Both ranks up and past their first heartbeat: a fixed --hang-timeout watches a rank only
    from then on (a rank stopped before it would never be judged hung)."""
    return ranks_up(samples) and len([name for name in samples
                                      if name.startswith("launcher_rank_heartbeat_age_seconds{")]) == 2


class AlertJob(BackgroundJob):
    """A two-rank job of WORKER with ``--metrics-port 0``: its port from the agent's log line."""

    def __init__(self, script: str, tmp_path: Path, flags: list[str], env: dict[str, str]) -> None:
        self.ready, self.trigger = tmp_path / "ready", tmp_path / "trigger"
        super().__init__(["--standalone", "--nproc-per-node", "2", "--metrics-port", "0",
                          *flags, script, str(self.ready), str(tmp_path / "go"), str(self.trigger)],
                         tmp_path / "go", env)
        self.lines: list[str] = []

    def port(self) -> int:
        """The metrics port, read from the agent's stderr as it says it."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = re.search(r"metrics on http://\S+:(\d+)/metrics", line)
            if found:
                return int(found.group(1))
        raise AssertionError(f"the agent never said its metrics port:\n{''.join(self.lines)}")

    def until(self, port: int, what: str, predicate: Any) -> dict[str, float]:
        """The first scrape that ``predicate`` accepts (fails the test with the agent's log if the job ends)."""
        def attempt() -> dict[str, float] | None:
            if self.process.poll() is not None:
                raise AssertionError(f"the job ended before {what}: {self.finish()}")
            samples = scrape(port)
            return samples if predicate(samples) else None
        return dict(wait_for(attempt, what))


def start(write_script: Any, tmp_path: Path, flags: list[str], env: dict[str, str]) -> AlertJob:
    return AlertJob(write_script("worker.py", WORKER), tmp_path, flags, env)


@pytest.mark.timeout(180)
def test_a_healthy_job_fires_no_alert(promtool, write_script, tmp_path):
    job = start(write_script, tmp_path, ["--hang-timeout", "60", "--max-restarts", "2"], {})
    try:
        port = job.port()
        scrapes = []
        for _ in range(3):  # what a healthy job looks like at any moment: each scrape is checked
            scrapes.append(job.until(port, "both ranks up", ranks_up))
            time.sleep(0.5)
    finally:
        code, stderr = job.finish()
    assert code == 0, stderr
    assert value(scrapes[-1], "launcher_max_restarts") == 2, scrapes[-1]
    promtool_test(promtool, tmp_path, recorded(scrapes), [(len(scrapes) + HOLD - 1, {})])


@pytest.mark.timeout(180)
def test_a_restart_storm_fires_the_storm_and_the_restarts_not_the_budget(promtool, write_script, tmp_path):
    job = start(write_script, tmp_path, ["--max-restarts", "5"], {"FAIL_ATTEMPTS": "3"})
    try:
        port = job.port()
        before = job.until(port, "both ranks up", ranks_up)
        job.trigger.touch()  # attempts 0, 1 and 2 fail; attempt 3 runs
        after = job.until(port, "three restarts", lambda s: ranks_up(s) and value(s, "launcher_restarts_total") == 3)
    finally:
        code, stderr = job.finish()
    assert code == 0, stderr
    labels = node_labels(after)
    # 15 minutes after the first scrape: the storm and the restarts are in the window, at 3.
    firing = {"LauncherRestartStorm": [expected("LauncherRestartStorm", labels, 3)],
              "LauncherWorkersRestarted": [expected("LauncherWorkersRestarted", labels, 3)]}
    promtool_test(promtool, tmp_path, recorded([before, after]), [(0, {}), (HOLD, firing)])


@pytest.mark.timeout(180)
def test_a_hang_fires_the_hang_the_restart_and_the_budget(promtool, write_script, tmp_path):
    job = start(write_script, tmp_path, ["--max-restarts", "1", "--hang-timeout", "2"], {"HANG": "1"})
    try:
        port = job.port()
        before = job.until(port, "both ranks heartbeating",
                           lambda s: ranks_beating(s) and value(s, "launcher_hangs_total") == 0)
        job.trigger.touch()  # rank 1 of attempt 0 stops heartbeating: hung 2 s later, then restarted
        after = job.until(port, "the hang and its restart", lambda s: ranks_up(s) and value(
            s, "launcher_hangs_total") == 1 and value(s, "launcher_restarts_total") == 1)
    finally:
        code, stderr = job.finish()
    assert code == 0, stderr
    assert value(after, "launcher_restarts_left") == 0, after
    labels = node_labels(after)
    firing = {"LauncherHangDiagnosed": [expected("LauncherHangDiagnosed", labels, 1)],
              "LauncherWorkersRestarted": [expected("LauncherWorkersRestarted", labels, 1)],
              "LauncherRestartBudgetLow": [expected("LauncherRestartBudgetLow", labels, 0)]}
    promtool_test(promtool, tmp_path, recorded([before, after]), [(0, {}), (HOLD, firing)])


def test_alerts_that_take_minutes_fire_on_hand_written_series(promtool, tmp_path):
    """Hand-written: a real job would need minutes (5 of slowness, 10 without a heartbeat or a
    worker) or a hung state that the agent ends within a publish interval."""
    node = 'job="j",node="n"'
    rank, calm = f'{node},rank="1",local_rank="1"', f'{node},rank="0",local_rank="0"'
    series: dict[str, list[float | str | None]] = {
        f"launcher_rank_hung{{{rank}}}": [*[0] * 16, 1],
        f"launcher_rank_hung{{{calm}}}": [0] * 17,
        f"launcher_rank_slow{{{rank}}}": [*[0] * 10, *[1] * 7],  # slow from minute 10
        f"launcher_rank_slow{{{calm}}}": [0] * 17,
        # Rank 1's heartbeat stops at minute 2; rank 0's first heartbeat is late, under 30 minutes.
        f"launcher_rank_heartbeat_age_seconds{{{rank}}}": [1, 1, 1, *[60 * m for m in range(1, 15)]],
        f"launcher_rank_no_heartbeat_yet_seconds{{{calm}}}": [60 * m for m in range(17)],
        'launcher_workers_alive{job="j",node="idle"}': [2, 2, *[0] * 15],  # none from minute 2
        f"launcher_workers_alive{{{node}}}": [2] * 17,
    }
    ranked = {"job": "j", "node": "n", "rank": "1", "local_rank": "1"}
    firing = {
        "LauncherRankHung": [expected("LauncherRankHung", ranked, 1)],
        "LauncherStraggler": [expected("LauncherStraggler", ranked, 1)],  # 6 minutes slow
        "LauncherNoProgress": [expected("LauncherNoProgress", ranked, 840)],  # over 600 s since minute 13
        "LauncherNoWorkers": [expected("LauncherNoWorkers", {"job": "j", "node": "idle"}, 0)],
    }
    # Minute 9: every condition but the idle node's is false, and its 10 minutes have not passed.
    promtool_test(promtool, tmp_path, series, [(9, {}), (16, firing)])


def test_spares_exhausted_and_a_node_kept_out_on_hand_written_series(promtool, tmp_path):
    """Hand-written (the metrics themselves: tests/status/test_render.py): a real job would need
    four agents, one killed and one sick."""
    kept_out = 'kept_out="gpu-c (10.0.0.3)",check="command"'
    series: dict[str, list[float | str | None]] = {
        'launcher_spares_waiting{job="j",node="a"}': [1, 1, 1, 0, 0, 0, 0],
        'launcher_spares_waiting{job="j",node="b"}': [1, 1, 1, "stale", None, None, None],  # the lost node
        'launcher_spares_waiting{job="never",node="a"}': [0] * 7,  # never had a spare: quiet
        f'launcher_kept_out_node{{job="j",node="a",{kept_out}}}': [None, 1, 1, 1, 1, 1, 1],
        f'launcher_kept_out_node{{job="j",node="b",{kept_out}}}': [None, 1, 1, "stale", None, None, None],
    }
    firing = {
        "LauncherSparesExhausted": [expected("LauncherSparesExhausted", {"job": "j"}, 0)],
        "LauncherNodeKeptOut": [expected("LauncherNodeKeptOut", {"job": "j", "kept_out": "gpu-c (10.0.0.3)",
                                                                 "check": "command"}, 1)],
    }
    # Minute 4: no spare for 1 minute, under the 2 minutes' `for:`; minute 6: past it.
    promtool_test(promtool, tmp_path, series, [(4, {"LauncherNodeKeptOut": firing["LauncherNodeKeptOut"]}),
                                               (6, firing)])
