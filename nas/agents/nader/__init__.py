"""NADER: agents that edit block graphs in the DAG language, a modification tree, the strategy."""
