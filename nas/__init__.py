"""nasflow: LLM-agent and classic neural architecture search in one harness.

`nas` is the library: representations, spaces, strategies, evaluators and the
search loop. It runs without Prefect; `supernets/` adds weight-sharing supernets, `tasks/`
and `flows/` add orchestration, `conf/` holds the Hydra config.
"""

__version__ = "0.1.0"
