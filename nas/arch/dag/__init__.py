"""NADER block-DAG language: parsing and structural validation."""

from nas.arch.dag.parse import IO_OPS, Block, BlockFile, Node, parse_block_file
from nas.arch.dag.validate import OPS, validate_structure

__all__ = ["IO_OPS", "OPS", "Block", "BlockFile", "Node", "parse_block_file", "validate_structure"]
