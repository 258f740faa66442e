"""The LLM methods, one folder each: `nader/` (block files; agents, modification tree,
strategy), `fairnad/` (model source), `collm/` (supernet encodings). In each, `agents.py` holds
the agents as typed functions (a prompt file from `prompts/`, a parser, one call through
`nas.llm.LLMClient.ask`) and `strategy.py` the search strategy that drives them."""
