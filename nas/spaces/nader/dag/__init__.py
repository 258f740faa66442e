"""NADER block-DAG language: parse, validate (structure, then shapes at a
position), canonical keys, compile to nn.Module, and the macro skeleton."""

from nas.spaces.nader.dag.canon import block_key, canonical_form
from nas.spaces.nader.dag.parse import IO_OPS, Block, BlockFile, Node, parse_block_file
from nas.spaces.nader.dag.shapes import Position, analyse
from nas.spaces.nader.dag.validate import OPS, validate_structure

__all__ = [
    "IO_OPS", "OPS", "Block", "BlockFile", "Node", "Position", "analyse", "block_key", "canonical_form",
    "parse_block_file", "validate_structure",
]
