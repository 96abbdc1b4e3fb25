import subprocess
import sys

HEAVY = (
    "openai",
    "faiss",
    "llama_index",
    "ray",
    "opentelemetry",
    "zstandard",
    "torch",
    "redis",
    "networkx",
    "sentence_transformers",
    "llama_cpp",
    "matplotlib",
    "typer",
    "rich",
    "click",
    "yaml",
    "mcp",
    "a2a",
    "starlette",
    "uvicorn",
)


def test_import_pulls_in_no_provider_sdk_or_heavy_library():
    code = (
        "import sys, metaroles; "
        f"heavy = [m for m in sys.modules if m.split('.')[0] in {HEAVY!r}]; "
        "print(','.join(heavy))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_import_has_no_side_effects(tmp_path):
    code = "import os, metaroles, logging; print(len(logging.getLogger().handlers), sorted(os.listdir('.')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert result.stdout.strip() == "0 []"


def test_public_surface_is_explicit():
    import metaroles

    assert all(hasattr(metaroles, name) for name in metaroles.__all__)
    for name in ("Role", "Action", "Message", "Environment", "Team", "Memory", "MessageQueue", "TestLLM"):
        assert name in metaroles.__all__
