"""Adapters that give agents written in a framework undolog by wrapping their tools.

Each adapter lives behind its own extra and is imported only when you import it:

- ``undolog.integrations.langchain`` (``pip install "undolog[langchain]"``): LangChain 1.x
  tools and agents, LangGraph graphs (``ToolNode``, checkpointers, ``interrupt()``);
- ``undolog.integrations.openai_agents`` (``pip install "undolog[openai-agents]"``): the
  OpenAI Agents SDK's ``function_tool``s.

This package itself imports nothing from any framework.
"""

from __future__ import annotations
