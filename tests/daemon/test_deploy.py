"""The files in deploy/ agree with the daemon: config keys are real options, dashboard metrics exist."""

from __future__ import annotations

import json
import re
import tomllib

from prometheus_client.parser import text_string_to_metric_families

from stager.cli import _default_map, cli
from tests.daemon.support import REPO

DEPLOY = REPO / "deploy"


def test_every_serve_setting_of_the_example_config_is_a_serve_option_with_a_valid_value():
    text = (DEPLOY / "config" / "stager.toml").read_text()
    config = tomllib.loads(text)
    commands = cli.all_commands()
    serve = commands["serve"]
    defaults = _default_map(config, commands)["serve"]
    shared = {k for k, v in config.items() if not isinstance(v, dict)}
    expected = (shared | set(config["serve"])) - {"storage_options"}
    # Every key of [serve] and every shared key lands on an option of `stager serve`.
    landed = {p.opts[0].lstrip("-").replace("-", "_") for p in serve.params if p.name in defaults}
    assert landed == expected
    # Every option of `stager serve` (but --config itself) is documented in the example, set or commented out.
    options = {p.opts[0].lstrip("-").replace("-", "_") for p in serve.params if p.opts[0].startswith("--")}
    documented = expected | set(re.findall(r"^# ?([a-z_]+) = ", text, re.M))
    assert options - {"config"} <= documented, sorted(options - {"config"} - documented)
    # And every value converts as the command would convert it.
    ctx = serve.make_context("serve", [], default_map=defaults)
    assert ctx.params["window"] == 2 * 1024**3 and ctx.params["socket_group"] == "stager"
    assert ctx.params["drain_timeout"] == 10.0 and ctx.params["local_sources"] is True


def test_the_systemd_unit_runs_serve_and_gives_it_time_to_drain():
    unit = (DEPLOY / "systemd" / "stager.service").read_text()
    assert re.search(r"^ExecStart=\S+/stager serve ", unit, re.M)
    assert re.search(r"^Type=notify$", unit, re.M) and re.search(r"^RuntimeDirectory=stager$", unit, re.M)
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    assert stop > 10 + 20, "longer than the default drain timeout plus the daemon's own watchdog grace"


async def test_every_metric_on_the_dashboard_is_exported(node):
    from stager.cluster import PeerConfig  # a node of a cluster, so that the cluster's metrics are there too

    daemon = await node.start(peers=PeerConfig.build("127.0.0.2:0", "127.0.0.2:9", b"a-cluster-secret-for-tests"))
    assert (await node.raw("PUT", "/v1/consumers/c/plans/p", json={"dataset": {"url": node.proxy.url}}))[0] == 200
    text = daemon.metrics.render(await daemon.snapshot()).decode()
    exported = set()
    for family in text_string_to_metric_families(text):
        exported.add(family.name)
        exported.update(sample.name for sample in family.samples)
    dashboard = json.loads((DEPLOY / "grafana" / "stager-dashboard.json").read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"\b((?:stager|process)_[a-z_]+)\b", target["expr"])}
    assert used and used <= exported, sorted(used - exported)
