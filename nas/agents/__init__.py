"""Design agents as typed functions: a prompt file, a parser and one call through
the LLM layer each (`nas.llm.LLMClient.ask`). No search logic and no stores:
callers (the strategies) pass texts in and get an `Answer` back."""
