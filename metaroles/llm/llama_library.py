"""llama.cpp's library as metaroles loads it: through llama-cpp-python, with OpenMP waiting passively.

llama.cpp's CPU backend waits on OpenMP, whose threads spin while they wait: where the cores are
busy (a laptop doing other things, two test workers) the spinning takes them from the work. A batch
that decodes in 9 s on a quiet 2-core machine took over 120 s beside two busy processes, and 12 s
waiting passively (quiet, passive costs 0-25 % on the smallest model). OpenMP reads its wait policy
once, when the library loads, so every module of ours that uses llama.cpp imports it from here; a
policy the user set (``OMP_WAIT_POLICY``) is kept.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import llama_cpp
from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

__all__ = ["LlamaGrammar", "json_schema_to_gbnf", "llama_cpp"]
