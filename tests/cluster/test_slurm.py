"""SLURM_JOB_NODELIST expansion: every bracket form Slurm writes, and one clear line for each malformed one."""

from __future__ import annotations

import pytest

from stager.cluster.slurm import MAX_HOSTS, expand_hostlist
from stager.errors import ConfigError


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node1,node2", ["node1", "node2"]),
    ("gpu[001-004,010],cpu7", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "cpu7"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[7]", ["n7"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),  # the lower bound's padding
    ("n[1,3,5-6]", ["n1", "n3", "n5", "n6"]),
    ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
    ("rack[1-2]n[08-09]", ["rack1n08", "rack1n09", "rack2n08", "rack2n09"]),
    ("[1-2]x", ["1x", "2x"]),
    ("pre[1-2]post", ["pre1post", "pre2post"]),
    ("a[1-2],b[1-2],a1", ["a1", "a2", "b1", "b2"]),  # duplicates dropped, first kept
    ("host-1.example,host-2.example", ["host-1.example", "host-2.example"]),
    ("  gpu[1-2] ", ["gpu1", "gpu2"]),
    ("g[1-2]-[5-6]", ["g1-5", "g1-6", "g2-5", "g2-6"]),
])
def test_expands(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, problem", [
    ("", "empty host name"),
    ("a,,b", "empty host name"),
    ("a,", "empty host name"),
    ("n[1-3", "'[' without ']'"),
    ("n1-3]", "']' without '['"),
    ("n[[1-2]]", "brackets inside brackets"),
    ("n[3-1]", "runs backwards"),
    ("n[a-b]", "not a number"),
    ("n[]", "not a number"),
    ("n[1-2,]", "not a number"),
    ("n[1-200000]", f"more than {MAX_HOSTS}"),
    ("a[1-1000]b[1-1000]", f"more than {MAX_HOSTS}"),
    ("a b", "space"),
])
def test_refuses_with_one_line_naming_the_variable(text, problem):
    with pytest.raises(ConfigError) as caught:
        expand_hostlist(text)
    message = str(caught.value)
    assert "SLURM_JOB_NODELIST" in message and problem in message and "\n" not in message
