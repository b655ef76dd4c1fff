"""The router's keys file (deployctl.render.keys): what a deploy and `deployctl keys` write reads back the same; a
deploy accepts the environment's keys and drops its own old ones, never a `keys add` one, and never accepts a
retired key again; malformed keys are refused naming where they came from."""
from __future__ import annotations

import pytest

from deployctl.errors import ConfigError
from deployctl.render import keys

A, B, C = "sk-aaaaaaaa.+aaaa", "sk-bbbbbbbbbbbbbb", "sk-cccc/cccc=cc~c"


def test_render_and_parse_round_trip_with_regex_characters_escaped():
    f = keys.synced(None, [A, B], "t0").with_key(keys.Key(C, "keys", "t1")).without({keys.key_id(B)}, "t2")
    text = keys.render("svc", f)
    assert keys.parse(text) == f
    assert r"sk-aaaaaaaa\.\+aaaa" in text and f'default "Bearer {A}";' in text  # A stays the engine key
    assert f"# retired {keys.key_id(B)} at=t2" in text and B not in text


def test_a_deploy_syncs_its_own_keys_only():
    f = keys.synced(None, [A, B], "t0").with_key(keys.Key(C, "keys", "t1"))
    g = keys.synced(f, [B], "t3")  # the deploy-based rotation dropped A
    assert g.ids() == [keys.key_id(B), keys.key_id(C)] and g.engine_key == B
    h = keys.synced(g.without({keys.key_id(B)}, "t4"), [B], "t5")  # retired by `keys retire`: stays retired
    assert h.ids() == [keys.key_id(C)] and h.engine_key == B
    assert h.with_key(keys.Key(B, "keys", "t6")).retired == ()  # `keys add` accepts it again


def test_malformed_keys_and_empty_files_are_refused():
    with pytest.raises(ConfigError, match=r"\$X .*not 8-512"):
        keys.check_key('sk-with"quote', "$X")
    with pytest.raises(ConfigError, match="accept no API key"):
        keys.render("svc", keys.KeysFile((), A))
    assert keys.key_id(A) == __import__("hashlib").sha256(A.encode()).hexdigest()[:12]
