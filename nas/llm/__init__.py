"""The LLM layer: one OpenAI-compatible client (embedded SmolLM2, any endpoint,
or a replay of a recorded run), prompt files, tolerant parsing, accounting."""

from nas.llm.client import Answer, LLMClient, LLMError, Reply
from nas.llm.config import LLMConfig
from nas.llm.parse import ParseError
from nas.llm.prompts import Prompt, load_prompt

__all__ = ["Answer", "LLMClient", "LLMConfig", "LLMError", "ParseError", "Prompt", "Reply", "load_prompt"]
