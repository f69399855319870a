"""The verifier registry (reward_models/load.py): every kind's name, loader and checks in one place,
read by every CLI for loading and checking and by the comparison's config check."""

from __future__ import annotations

import pytest

from reward_models import load
from reward_models.prm_families import FAMILY_NAMES


def test_every_kind_is_registered_once_with_its_loader_and_checks():
    kinds = load.verifier_kinds()
    expected = {"confidence", "step-confidence", "step-likelihood", "exact", "exact-noisy", "implicit",
                "auto", "product", "min", load.PATH_KIND, *FAMILY_NAMES}
    assert set(kinds) == expected and len(kinds) == len(expected)
    for name in kinds:
        kind = load.VERIFIER_KINDS[name]
        assert kind.name == name
        assert callable(kind.load) and callable(kind.check) and callable(kind.check_form)
    assert load.COMBINE_RULES == ("product", "min")
    with pytest.raises(ValueError, match="registered twice"):
        load.register_verifier_kind("exact", usage="exact")(lambda rest, ctx: None)


def test_a_registered_kind_is_resolved_loaded_and_checked_through_the_registry(monkeypatch):
    loaded = []

    @load.register_verifier_kind("test-kind", usage="test-kind:PATH")
    def _load(rest, ctx):
        loaded.append((rest, ctx.batch_size))
        return "a verifier"

    try:
        assert "test-kind" in load.verifier_kinds() and "test-kind:PATH" in load.kinds_help()
        assert load.split_spec("test-kind:x") == ("test-kind", "x")
        assert load.load_verifier("test-kind:x", batch_size=3) == "a verifier" and loaded == [("x", 3)]
        load.check_spec_form("product:test-kind:x,exact")
        with pytest.raises(ValueError, match="name the model"):
            load.check_spec("test-kind:")
    finally:
        del load.VERIFIER_KINDS["test-kind"]


@pytest.mark.parametrize("check", [lambda s: load.check_spec(s), load.check_spec_form])
def test_an_unknown_kind_is_refused_naming_every_kind(tmp_path, check):
    spec = f"verfier-typo:{tmp_path / 'x'}"
    with pytest.raises(load.UnknownVerifierKindError) as err:
        check(spec)
    message = str(err.value)
    assert "'verfier-typo' is no verifier kind" in message
    for kind in load.VERIFIER_KINDS.values():
        assert kind.usage in message
    assert "step-likelihood[:PATH]" in message and "implicit:PATH" in message


def test_the_comparison_checks_verifier_specs_with_the_same_registry(monkeypatch):
    from compare import config

    with pytest.raises(config.CompareError) as err:
        config.check_verifier_spec("product:step-likelihood:verifier_lm,nonsense:x", "psv.path")
    assert str(err.value).startswith("psv.path: ") and load.kinds_help() in str(err.value)
    config.check_verifier_spec("step-likelihood:verifier_lm", "psv.path")  # built later: its form is enough
    config.check_verifier_spec("implicit:later", "eval.verifier")
    with pytest.raises(config.CompareError, match="exact-noisy"):
        config.check_verifier_spec("exact-noisy:accept=2", "eval.verifier")

    calls = []
    real = load.check_spec_form
    monkeypatch.setattr(load, "check_spec_form", lambda spec: calls.append(spec) or real(spec))
    config.check_verifier_spec("exact", "eval.verifier")
    assert calls == ["exact"]


def test_inference_evaluate_reads_no_exception_text():
    """A method run without the verifier it needs raises a type, not a message to match."""
    from pathlib import Path

    from inference.methods.base import NoVerifierError, Tracker

    source = (Path(__file__).parents[1] / "inference" / "evaluate.py").read_text()
    assert "in str(e)" not in source and "NoVerifierError" in source
    with pytest.raises(NoVerifierError):
        Tracker(generator=None, verifier=None, n_problems=1).score([0], ["q"], [["a"]])


def test_the_registry_holds_the_kind_facts_the_clis_read():
    """Which kinds check world problems only, which PPO trains online and which are an upper
    reference live in the registry, read per part of a combined spec."""
    facts = {name: (k.needs_world, k.trains_online, k.reference) for name, k in load.VERIFIER_KINDS.items()}
    assert {n for n, f in facts.items() if f[0]} == {"exact", "exact-noisy"}
    assert {n for n, f in facts.items() if f[1]} == {"implicit"}
    assert {n for n, f in facts.items() if f[2]} == {"exact"}
    assert [k.name for k in load.kinds_of("product:exact-noisy:accept=0.5,implicit:/x")] == ["exact-noisy", "implicit"]
    assert load.is_reference_spec("exact") and not load.is_reference_spec("min:exact,step-confidence")
    assert not load.is_reference_spec(None) and not load.is_reference_spec("exact-noisy:accept=0.5")
