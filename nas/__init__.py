"""nasflow: LLM-agent and classic neural architecture search in one harness.

`nas` is the library: representations, spaces, strategies, evaluators and the
search loop. It runs without Prefect; `nas/orchestration/flows/` and `nas/orchestration/tasks/` add orchestration.
"""

__version__ = "0.1.0"
